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
    b = TokenBucket(rate=2.0, burst=3)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(0.0) == pytest.approx(0.5)  # one token every 0.5 s
    assert b.take(0.5) == 0.0
    assert b.take(0.5) > 0
    assert [b.take(10.0) for _ in range(3)] == [0.0, 0.0, 0.0]  # refilled to the burst, not beyond
    assert b.take(10.0) > 0


def test_rate_limiter_is_per_tenant_and_keeps_buckets_across_reloads():
    now = [0.0]
    rl = RateLimiter(clock=lambda: now[0])
    rl.configure({"a": (1.0, 1), "b": None})
    assert rl.retry_after("a") == 0 and rl.retry_after("a") == 1  # Retry-After in whole seconds, >= 1
    assert all(rl.retry_after("b") == 0 for _ in range(50))  # unlimited
    rl.configure({"a": (1.0, 1), "b": None})  # a reload with the same limit: no fresh burst
    assert rl.retry_after("a") == 1
    rl.configure({"a": (100.0, 5)})  # a new limit takes effect at once
    assert rl.retry_after("a") == 0
    now[0] = 0.2
    rl.configure({})
    assert rl.retry_after("a") == 0  # limit removed


# ---------------------------------------------------------------------------------- shard cache
def test_byte_lru_evicts_least_recently_used_by_bytes():
    c = ByteLRU(100)
    assert c.put("a", 1, 40) == [] and c.put("b", 2, 40) == []
    assert c.get("a") == 1  # a is now the most recent
    assert c.put("c", 3, 40) == ["b"]
    assert c.keys() == ["a", "c"] and c.bytes == 80
    assert c.put("huge", 4, 500) == ["a", "c"]  # bigger than the budget: admitted alone
    assert c.keys() == ["huge"] and c.bytes == 500
    assert c.pop("huge") == 4 and c.bytes == 0 and c.get("huge") is None
    c.put("x", 1, 10)
    c.put("x", 2, 30)  # replacing counts the new size only
    assert c.bytes == 30 and c.get("x") == 2


# ---------------------------------------------------------------------------------- tenants file
def test_rotate_remove_and_admin_key(tmp_path):
    f = tmp_path / "t.yaml"
    old = add_tenant(f, "acme", tmp_path, rate_limit={"rps": 5, "burst": 10})
    add_tenant(f, "globex", tmp_path)
    new = rotate_key(f, "acme")
    t = load_tenants(f)
    assert t.authenticate(f"Bearer {new}").name == "acme"
    assert t.by_name["acme"].rate_limit.rps == 5  # rotation keeps the rest of the entry
    with pytest.raises(ApiError) as e:
        t.authenticate(f"Bearer {old}")
    assert e.value.status == 401
    with pytest.raises(ApiError) as e:
        t.is_admin(f"Bearer {new}")
    assert e.value.status == 403  # no admin key configured yet
    with pytest.raises(ApiError) as e:
        t.is_admin(None)
    assert (e.value.status, e.value.headers) == (401, {"WWW-Authenticate": "Bearer"})  # no credentials: 401 first
    admin = set_admin_key(f)
    t = load_tenants(f)
    assert t.is_admin(f"Bearer {admin}") and admin not in f.read_text() and hash_key(admin) in f.read_text()
    with pytest.raises(ApiError) as e:
        t.is_admin(f"Bearer {new}")
    assert e.value.status == 401
    with pytest.raises(ApiError):
        t.authenticate(f"Bearer {admin}")  # the admin key is not a tenant key
    remove_tenant(f, "acme")
    assert set(load_tenants(f).by_name) == {"globex"}
    with pytest.raises(QragError, match="no tenant 'acme'.*globex"):
        rotate_key(f, "acme")
    with pytest.raises(QragError, match="no tenant 'nope'"):
        remove_tenant(f, "nope")


def test_thousand_tenants_authenticate_by_hash(tmp_path):
    from qrag_ray.serving.tenants import Tenant, Tenants, new_key

    keys = [new_key() for _ in range(1000)]
    ts = Tenants.from_list([Tenant(name=f"t{i}", index=str(tmp_path), key_sha256=hash_key(k)) for i, k in enumerate(keys)])
    assert len(ts.by_hash) == 1000
    assert all(ts.authenticate(f"Bearer {keys[i]}").name == f"t{i}" for i in (0, 499, 999))


# ---------------------------------------------------------------------------------- registry
def test_registry_picks_up_changes_and_keeps_the_last_good_table(tmp_path):
    f = tmp_path / "t.yaml"
    ka = add_tenant(f, "acme", tmp_path)
    reg = TenantRegistry.from_file(f)
    assert not reg.refresh()  # unchanged
    kb = add_tenant(f, "globex", tmp_path)
    assert reg.refresh() and reg.tenants.authenticate(f"Bearer {kb}").name == "globex"
    good = f.read_text()
    f.write_text("tenants: [oops")
    assert not reg.refresh()
    assert "kept the previous tenants table" in reg.error and reg.tenants.authenticate(f"Bearer {ka}").name == "acme"
    f.write_text(good.replace("acme", "acme2"))
    assert reg.refresh() and reg.error is None and set(reg.tenants.by_name) == {"acme2", "globex"}
    # a Kubernetes-style swap: the path is a symlink re-pointed at a new file
    link = tmp_path / "link.yaml"
    os.symlink(f, link)
    reg2 = TenantRegistry.from_file(link)
    g = tmp_path / "t2.yaml"
    add_tenant(g, "solo", tmp_path)
    tmp = tmp_path / "link.tmp"
    os.symlink(g, tmp)
    os.replace(tmp, link)
    assert reg2.refresh() and set(reg2.tenants.by_name) == {"solo"}
