"""Tenants file and key checks (pure, milliseconds)."""

from __future__ import annotations

import pytest
import yaml

from qrag_ray.errors import QragError
from qrag_ray.serving.api_errors import ApiError
from qrag_ray.serving.tenants import (
    DEFAULT_TENANT,
    Tenant,
    Tenants,
    add_tenant,
    hash_key,
    load_tenants,
    new_key,
    remove_tenant,
    rotate_key,
    set_admin_key,
)


def test_add_tenant_stores_only_the_hash(tmp_path):
    f = tmp_path / "tenants.yaml"
    ka = add_tenant(f, "acme", tmp_path / "a")
    kb = add_tenant(f, "globex", tmp_path / "b")
    text = f.read_text()
    assert ka not in text and kb not in text and hash_key(ka) in text
    assert ka.startswith("qrag_") and ka != kb and len(ka) > 40
    assert (f.stat().st_mode & 0o777) == 0o600
    t = load_tenants(f)
    assert set(t.by_name) == {"acme", "globex"} and not t.open
    assert t.by_name["acme"].index == str((tmp_path / "a").resolve())


def test_rotating_a_key_invalidates_the_old_one(tmp_path):
    f = tmp_path / "t.yaml"
    old = add_tenant(f, "acme", tmp_path)
    new = add_tenant(f, "acme", tmp_path)
    t = load_tenants(f)
    assert len(t.by_name) == 1
    assert t.authenticate(f"Bearer {new}").name == "acme"
    with pytest.raises(ApiError) as e:
        t.authenticate(f"Bearer {old}")
    assert e.value.status == 401


def test_rotate_remove_and_admin_key_edit_the_file_in_place(tmp_path):
    f = tmp_path / "t.yaml"
    old, other = add_tenant(f, "acme", tmp_path), add_tenant(f, "globex", tmp_path)
    new, admin = rotate_key(f, "acme"), set_admin_key(f)
    t = load_tenants(f)
    assert t.authenticate(f"Bearer {new}").name == "acme" and t.authenticate(f"Bearer {other}").name == "globex"
    assert hash_key(old) not in f.read_text() and hash_key(admin) in f.read_text()
    remove_tenant(f, "acme")
    assert set(load_tenants(f).by_name) == {"globex"}
    for edit in (rotate_key, remove_tenant):  # a name the file lacks: one error naming who is there
        with pytest.raises(QragError, match=r"no tenant 'acme' in .*t.yaml \(tenants: globex\)"):
            edit(f, "acme")
    assert set(load_tenants(f).by_name) == {"globex"}  # a failed edit writes nothing


def _two(tmp_path):
    ka, kb = new_key(), new_key()
    t = Tenants.from_list([Tenant(name="a", index=str(tmp_path / "a"), key_sha256=hash_key(ka)),
                           Tenant(name="b", index=str(tmp_path / "b"), key_sha256=hash_key(kb))])
    return t, ka, kb


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", "Basic abc", "Bearer wrong", "token x"])
def test_authenticate_rejects_with_401(tmp_path, header):
    t, _, _ = _two(tmp_path)
    with pytest.raises(ApiError) as e:
        t.authenticate(header)
    assert e.value.status == 401 and e.value.headers == {"WWW-Authenticate": "Bearer"}


def test_authenticate_and_resolve(tmp_path):
    t, ka, kb = _two(tmp_path)
    assert t.authenticate(f"Bearer {ka}").name == "a"
    assert t.authenticate(f"bearer  {kb} ").name == "b"
    a = t.by_name["a"]
    assert t.resolve(a, None) is a and t.resolve(a, "a") is a
    with pytest.raises(ApiError) as e:
        t.resolve(a, "b")
    assert e.value.status == 403
    with pytest.raises(ApiError) as e:
        t.resolve(a, "zzz")
    assert e.value.status == 404


def test_open_default_tenant_needs_no_key(tmp_path):
    t = Tenants.single(str(tmp_path))
    assert t.open and t.authenticate(None).name == DEFAULT_TENANT
    with pytest.raises(ApiError):
        t.resolve(t.by_name[DEFAULT_TENANT], "other")


@pytest.mark.parametrize("content,msg", [
    ("tenants: []", "no tenants"),
    ("tenants:\n  - {name: a, index: /x}", "without key_sha256"),
    ("tenants:\n  - {name: a, index: /x, key_sha256: abc}", "64 lowercase hex"),
    ("tenants:\n  - {name: 'a b', index: /x, key_sha256: '" + "0" * 64 + "'}", "tenant names"),
    ("tenants:\n  - {name: a, index: /x, key_sha256: '" + "0" * 64 + "'}\n  - {name: a, index: /y, key_sha256: '"
     + "1" * 64 + "'}", "duplicate"),
    ("tenants:\n  - {name: a, index: /x, key_sha256: '" + "0" * 64 + "'}\n  - {name: b, index: /y, key_sha256: '"
     + "0" * 64 + "'}", "share one API key"),
    ("tenants:\n  - {name: a, index: /x, key: plain}", "key"),
    ("tenants: [", "not valid YAML"),
])
def test_bad_tenants_files_are_one_line_errors(tmp_path, content, msg):
    f = tmp_path / "t.yaml"
    f.write_text(content)
    with pytest.raises(QragError, match=msg):
        load_tenants(f)


def test_missing_tenants_file(tmp_path):
    with pytest.raises(QragError, match="not found"):
        load_tenants(tmp_path / "nope.yaml")


def test_dumped_tenants_round_trip_without_their_keys(tmp_path):
    t, ka, _ = _two(tmp_path)
    dumped = [x.model_dump() for x in t.by_name.values()]
    assert Tenants.from_list(dumped).authenticate(f"Bearer {ka}").name == "a"
    assert "key" not in yaml.safe_dump(dumped).replace("key_sha256", "")
