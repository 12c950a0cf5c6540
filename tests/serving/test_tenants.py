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
    tenants_file = tmp_path / "tenants.yaml"
    acme_key = add_tenant(tenants_file, "acme", tmp_path / "a")
    globex_key = add_tenant(tenants_file, "globex", tmp_path / "b")
    text = tenants_file.read_text()
    assert acme_key not in text and globex_key not in text and hash_key(acme_key) in text
    assert acme_key.startswith("qrag_") and acme_key != globex_key and len(acme_key) > 40
    assert (tenants_file.stat().st_mode & 0o777) == 0o600
    tenants = load_tenants(tenants_file)
    assert set(tenants.by_name) == {"acme", "globex"} and not tenants.open
    assert tenants.by_name["acme"].index == str((tmp_path / "a").resolve())


def test_rotating_a_key_invalidates_the_old_one(tmp_path):
    tenants_file = tmp_path / "t.yaml"
    old_key = add_tenant(tenants_file, "acme", tmp_path)
    rotated_key = add_tenant(tenants_file, "acme", tmp_path)
    tenants = load_tenants(tenants_file)
    assert len(tenants.by_name) == 1
    assert tenants.authenticate(f"Bearer {rotated_key}").name == "acme"
    with pytest.raises(ApiError) as raised:
        tenants.authenticate(f"Bearer {old_key}")
    assert raised.value.status == 401


def test_rotate_remove_and_admin_key_edit_the_file_in_place(tmp_path):
    tenants_file = tmp_path / "t.yaml"
    old_key = add_tenant(tenants_file, "acme", tmp_path)
    globex_key = add_tenant(tenants_file, "globex", tmp_path)
    rotated_key = rotate_key(tenants_file, "acme")
    admin = set_admin_key(tenants_file)
    tenants = load_tenants(tenants_file)
    assert tenants.authenticate(f"Bearer {rotated_key}").name == "acme"
    assert tenants.authenticate(f"Bearer {globex_key}").name == "globex"
    assert hash_key(old_key) not in tenants_file.read_text() and hash_key(admin) in tenants_file.read_text()
    remove_tenant(tenants_file, "acme")
    assert set(load_tenants(tenants_file).by_name) == {"globex"}
    for edit in (rotate_key, remove_tenant):  # a name the file lacks: one error naming who is there
        with pytest.raises(QragError, match=r"no tenant 'acme' in .*t.yaml \(tenants: globex\)"):
            edit(tenants_file, "acme")
    assert set(load_tenants(tenants_file).by_name) == {"globex"}  # a failed edit writes nothing


def _two(tmp_path):
    key_a = new_key()
    key_b = new_key()
    tenants = Tenants.from_list([Tenant(name="a", index=str(tmp_path / "a"), key_sha256=hash_key(key_a)),
                                 Tenant(name="b", index=str(tmp_path / "b"), key_sha256=hash_key(key_b))])
    return tenants, key_a, key_b


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", "Basic abc", "Bearer wrong", "token x"])
def test_authenticate_rejects_with_401(tmp_path, header):
    tenants, _, _ = _two(tmp_path)
    with pytest.raises(ApiError) as raised:
        tenants.authenticate(header)
    assert raised.value.status == 401 and raised.value.headers == {"WWW-Authenticate": "Bearer"}


def test_authenticate_and_resolve(tmp_path):
    tenants, key_a, key_b = _two(tmp_path)
    assert tenants.authenticate(f"Bearer {key_a}").name == "a"
    assert tenants.authenticate(f"bearer  {key_b} ").name == "b"
    tenant_a = tenants.by_name["a"]
    assert tenants.resolve(tenant_a, None) is tenant_a and tenants.resolve(tenant_a, "a") is tenant_a
    with pytest.raises(ApiError) as raised:
        tenants.resolve(tenant_a, "b")
    assert raised.value.status == 403
    with pytest.raises(ApiError) as raised:
        tenants.resolve(tenant_a, "zzz")
    assert raised.value.status == 404


def test_open_default_tenant_needs_no_key(tmp_path):
    tenants = Tenants.single(str(tmp_path))
    assert tenants.open and tenants.authenticate(None).name == DEFAULT_TENANT
    with pytest.raises(ApiError):
        tenants.resolve(tenants.by_name[DEFAULT_TENANT], "other")


@pytest.mark.parametrize("content,message", [
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
def test_bad_tenants_files_are_one_line_errors(tmp_path, content, message):
    tenants_file = tmp_path / "t.yaml"
    tenants_file.write_text(content)
    with pytest.raises(QragError, match=message):
        load_tenants(tenants_file)


def test_missing_tenants_file(tmp_path):
    with pytest.raises(QragError, match="not found"):
        load_tenants(tmp_path / "nope.yaml")


def test_dumped_tenants_round_trip_without_their_keys(tmp_path):
    tenants, key_a, _ = _two(tmp_path)
    dumped = [x.model_dump() for x in tenants.by_name.values()]
    assert Tenants.from_list(dumped).authenticate(f"Bearer {key_a}").name == "a"
    assert "key" not in yaml.safe_dump(dumped).replace("key_sha256", "")
