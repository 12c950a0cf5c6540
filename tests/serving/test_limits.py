"""The pure parts of serving under change: token buckets, the byte-bounded shard cache, the tenant
registry that re-reads its file, key rotation/removal and the admin key (milliseconds, no Ray)."""

from __future__ import annotations

import os

import pytest

from qrag_ray.errors import QragError
from qrag_ray.runtime.byte_lru import ByteLRU
from qrag_ray.serving.api_errors import ApiError
from qrag_ray.serving.ratelimit import RateLimiter, TokenBucket
from qrag_ray.serving.registry import TenantRegistry
from qrag_ray.serving.tenants import add_tenant, hash_key, load_tenants, remove_tenant, rotate_key, set_admin_key


# ---------------------------------------------------------------------------------- rate limits
def test_token_bucket_allows_a_burst_then_the_rate():
    bucket = TokenBucket(rate=2.0, burst=3)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)  # one token every 0.5 s
    assert bucket.take(0.5) == 0.0
    assert bucket.take(0.5) > 0
    assert [bucket.take(10.0) for _ in range(3)] == [0.0, 0.0, 0.0]  # refilled to the burst, not beyond
    assert bucket.take(10.0) > 0


def test_rate_limiter_is_per_tenant_and_keeps_buckets_across_reloads():
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    limiter.configure({"a": (1.0, 1), "b": None})
    assert limiter.retry_after("a") == 0 and limiter.retry_after("a") == 1  # Retry-After in whole seconds, >= 1
    assert all(limiter.retry_after("b") == 0 for _ in range(50))  # unlimited
    limiter.configure({"a": (1.0, 1), "b": None})  # a reload with the same limit: no fresh burst
    assert limiter.retry_after("a") == 1
    limiter.configure({"a": (100.0, 5)})  # a new limit takes effect at once
    assert limiter.retry_after("a") == 0
    now[0] = 0.2
    limiter.configure({})
    assert limiter.retry_after("a") == 0  # limit removed


# ---------------------------------------------------------------------------------- shard cache
def test_byte_lru_evicts_least_recently_used_by_bytes():
    cache = ByteLRU(100)
    assert cache.put("a", 1, 40) == [] and cache.put("b", 2, 40) == []
    assert cache.get("a") == 1  # a is now the most recent
    assert cache.put("c", 3, 40) == ["b"]
    assert cache.keys() == ["a", "c"] and cache.bytes == 80
    assert cache.put("huge", 4, 500) == ["a", "c"]  # bigger than the budget: admitted alone
    assert cache.keys() == ["huge"] and cache.bytes == 500
    assert cache.pop("huge") == 4 and cache.bytes == 0 and cache.get("huge") is None
    cache.put("x", 1, 10)
    cache.put("x", 2, 30)  # replacing counts the new size only
    assert cache.bytes == 30 and cache.get("x") == 2


# ---------------------------------------------------------------------------------- tenants file
def test_rotate_remove_and_admin_key(tmp_path):
    tenants_file = tmp_path / "t.yaml"
    old_key = add_tenant(tenants_file, "acme", tmp_path, rate_limit={"rps": 5, "burst": 10})
    add_tenant(tenants_file, "globex", tmp_path)
    rotated_key = rotate_key(tenants_file, "acme")
    tenants = load_tenants(tenants_file)
    assert tenants.authenticate(f"Bearer {rotated_key}").name == "acme"
    assert tenants.by_name["acme"].rate_limit.rps == 5  # rotation keeps the rest of the entry
    with pytest.raises(ApiError) as raised:
        tenants.authenticate(f"Bearer {old_key}")
    assert raised.value.status == 401
    with pytest.raises(ApiError) as raised:
        tenants.is_admin(f"Bearer {rotated_key}")
    assert raised.value.status == 403  # no admin key configured yet
    with pytest.raises(ApiError) as raised:
        tenants.is_admin(None)
    # no credentials: 401 first
    assert (raised.value.status, raised.value.headers) == (401, {"WWW-Authenticate": "Bearer"})
    admin = set_admin_key(tenants_file)
    tenants = load_tenants(tenants_file)
    assert tenants.is_admin(f"Bearer {admin}")
    assert admin not in tenants_file.read_text() and hash_key(admin) in tenants_file.read_text()
    with pytest.raises(ApiError) as raised:
        tenants.is_admin(f"Bearer {rotated_key}")
    assert raised.value.status == 401
    with pytest.raises(ApiError):
        tenants.authenticate(f"Bearer {admin}")  # the admin key is not a tenant key
    remove_tenant(tenants_file, "acme")
    assert set(load_tenants(tenants_file).by_name) == {"globex"}
    with pytest.raises(QragError, match="no tenant 'acme'.*globex"):
        rotate_key(tenants_file, "acme")
    with pytest.raises(QragError, match="no tenant 'nope'"):
        remove_tenant(tenants_file, "nope")


def test_thousand_tenants_authenticate_by_hash(tmp_path):
    from qrag_ray.serving.tenants import Tenant, Tenants, new_key

    keys = [new_key() for _ in range(1000)]
    tenants = Tenants.from_list([Tenant(name=f"t{i}", index=str(tmp_path), key_sha256=hash_key(k))
                                 for i, k in enumerate(keys)])
    assert len(tenants.by_hash) == 1000
    assert all(tenants.authenticate(f"Bearer {keys[i]}").name == f"t{i}" for i in (0, 499, 999))


# ---------------------------------------------------------------------------------- registry
def test_registry_picks_up_changes_and_keeps_the_last_good_table(tmp_path):
    tenants_file = tmp_path / "t.yaml"
    acme_key = add_tenant(tenants_file, "acme", tmp_path)
    registry = TenantRegistry.from_file(tenants_file)
    assert not registry.refresh()  # unchanged
    globex_key = add_tenant(tenants_file, "globex", tmp_path)
    assert registry.refresh() and registry.tenants.authenticate(f"Bearer {globex_key}").name == "globex"
    good = tenants_file.read_text()
    tenants_file.write_text("tenants: [oops")
    assert not registry.refresh()
    assert "kept the previous tenants table" in registry.error
    assert registry.tenants.authenticate(f"Bearer {acme_key}").name == "acme"
    tenants_file.write_text(good.replace("acme", "acme2"))
    assert registry.refresh() and registry.error is None and set(registry.tenants.by_name) == {"acme2", "globex"}
    # a Kubernetes-style swap: the path is a symlink re-pointed at a new file
    link = tmp_path / "link.yaml"
    os.symlink(tenants_file, link)
    linked_registry = TenantRegistry.from_file(link)
    other_file = tmp_path / "t2.yaml"
    add_tenant(other_file, "solo", tmp_path)
    new_link = tmp_path / "link.tmp"
    os.symlink(other_file, new_link)
    os.replace(new_link, link)
    assert linked_registry.refresh() and set(linked_registry.tenants.by_name) == {"solo"}
