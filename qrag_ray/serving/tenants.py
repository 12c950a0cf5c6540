"""Tenants (the file: docs/SERVING.md): who may query which index, API keys stored only as sha256, and the
file's edits (add, rotate, remove: each written to a temporary file and renamed over it). Each tenant owns
exactly one index, named after it. Without a tenants file the server has one open
tenant (`default`) and no keys, meant for 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from qrag_ray.config.yaml_file import read_yaml
from qrag_ray.errors import QragError
from qrag_ray.serving.api_errors import ApiError, forbidden, unauthorized
from qrag_ray.serving.api_models import INDEX_NAME

DEFAULT_TENANT = "default"
KEY_PREFIX = "qrag_"
SCOPES = ("read", "write")  # write: read + write (POST/DELETE /v1/documents)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _check_hash(digest: str | None, what: str = "") -> str | None:
    if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"{what}must be 64 lowercase hex characters (sha256 of the key)")
    return digest


class RateLimit(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rps: float = Field(..., gt=0, description="sustained requests per second (per Router replica)")
    burst: int = Field(..., ge=1, description="requests allowed at once after an idle spell")


class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    index: str
    key_sha256: str | None = Field(None, description="sha256 hex of the API key; None only for the open default tenant")
    rate_limit: RateLimit | None = None
    scope: Literal["read", "write"] = Field("read", description="what the key may do: read (search, fetch), or write "
                                                                "(read + add, replace and delete documents)")

    def require_write(self) -> None:
        """403 unless this tenant's key may write."""
        if self.scope != "write":
            raise forbidden(f"this API key of tenant '{self.name}' is a read key; writes need a key with scope write "
                            "(`qrag tenants rotate --scope write`)")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not re.match(INDEX_NAME, name):
            raise ValueError("tenant names are 1-64 characters of letters, digits, '_', '-', '.'")
        return name

    @field_validator("key_sha256")
    @classmethod
    def _hash(cls, digest: str | None) -> str | None:
        return _check_hash(digest, "key_sha256 ")


class _TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    admin_key_sha256: str | None = None
    tenants: list[Tenant] = Field(default_factory=list)

    @field_validator("admin_key_sha256")
    @classmethod
    def _admin(cls, digest: str | None) -> str | None:
        return _check_hash(digest)


@dataclass(frozen=True)
class Tenants:
    """The tenant table a router checks every request against."""

    by_name: dict[str, Tenant]
    open: bool  # no keys: the single default tenant answers unauthenticated requests
    admin_sha256: str | None = None
    by_hash: dict[str, Tenant] = field(default_factory=dict)

    def __post_init__(self):
        if not self.by_hash:
            self.by_hash.update({t.key_sha256: t for t in self.by_name.values() if t.key_sha256})

    @classmethod
    def single(cls, index: str) -> "Tenants":
        """The open server's one tenant (127.0.0.1, no keys): it may write, as it may read the admin status."""
        return cls({DEFAULT_TENANT: Tenant(name=DEFAULT_TENANT, index=str(index), scope="write")}, open=True)

    @classmethod
    def from_list(cls, tenants: list[Tenant | dict], admin_sha256: str | None = None) -> "Tenants":
        validated = [t if isinstance(t, Tenant) else Tenant.model_validate(t) for t in tenants]
        if not validated:
            raise QragError("the tenants file lists no tenants")
        names = [t.name for t in validated]
        if dup := {n for n in names if names.count(n) > 1}:
            raise QragError(f"duplicate tenant names: {', '.join(sorted(dup))}")
        if missing := [t.name for t in validated if not t.key_sha256]:
            raise QragError(f"tenants without key_sha256: {', '.join(missing)} "
                            "(create entries with `qrag tenants add`)")
        hashes = [t.key_sha256 for t in validated]
        if len(set(hashes)) != len(hashes) or admin_sha256 in hashes:
            raise QragError("two tenants (or a tenant and the admin) share one API key")
        return cls({t.name: t for t in validated}, open=False, admin_sha256=admin_sha256)

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant whose key is in `Authorization: Bearer KEY` (401 otherwise), found by its sha256."""
        if self.open:
            return self.by_name[DEFAULT_TENANT]
        found = self.by_hash.get(hash_key(_bearer(authorization)))
        if found is None:
            raise unauthorized("unknown API key")
        return found

    def is_admin(self, authorization: str | None) -> bool:
        """The admin key (or any caller of an open, single-index server, which binds to 127.0.0.1)."""
        if self.open:
            return True
        key = _bearer(authorization)  # no credentials at all: 401 (with WWW-Authenticate), whatever the server has
        if self.admin_sha256 is None:
            raise forbidden("this server has no admin key: set one with `qrag tenants admin-key`")
        if not hmac.compare_digest(hash_key(key), self.admin_sha256):
            raise unauthorized("unknown admin key")
        return True

    def resolve(self, tenant: Tenant, index: str | None) -> Tenant:
        """The tenant whose index the request reads: its own; naming another tenant's index is 403."""
        if index is None or index == tenant.name:
            return tenant
        if index in self.by_name:
            raise forbidden(f"this API key may not read index '{index}'")
        raise ApiError(404, "not_found", f"unknown index '{index}'")


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise unauthorized("missing API key: send 'Authorization: Bearer KEY'")
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise unauthorized("malformed Authorization header: expected 'Bearer KEY'")
    return key.strip()


# ---- the tenants file --------------------------------------------------------------------------
def _parse(path: Path, data) -> _TenantsFile:
    from qrag_ray.config.index import format_validation_error

    try:
        return _TenantsFile.model_validate(data)
    except ValidationError as error:
        raise QragError(f"tenants file {path}: {format_validation_error(error)}") from None


def load_tenants(path: str | Path) -> Tenants:
    tenants_file = _parse(Path(path), read_yaml(path, "tenants file", default={}))
    return Tenants.from_list(tenants_file.tenants, tenants_file.admin_key_sha256)


@contextlib.contextmanager
def _editing(path: str | Path) -> Iterator[dict]:
    """The tenants file's data (a missing file: none) to change in place; written back when the block ends."""
    path = Path(path)
    data = read_yaml(path, "tenants file", default={}) if path.is_file() else {}
    _parse(path, data)
    data.setdefault("tenants", [])
    yield data
    _write_file(path, data)


def _entry(data: dict, name: str, path: str | Path) -> dict:
    for tenant in data["tenants"]:
        if tenant.get("name") == name:
            return tenant
    have = ", ".join(t.get("name", "?") for t in data["tenants"]) or "none"
    raise QragError(f"no tenant {name!r} in {path} (tenants: {have})")


def add_tenant(path: str | Path, name: str, index: str | Path, rate_limit: dict | None = None,
               scope: str = "read") -> str:
    """Add a tenant (or replace its entry with a new key) and return the key; the file holds only its hash.
    `scope`: read, or write (read + write); a read key's entry leaves it out, as entries written before
    scopes existed do."""
    with _editing(path) as data:
        entry = Tenant(name=name, index=str(Path(index).resolve()), key_sha256=hash_key(key := new_key()),
                       rate_limit=rate_limit, scope=scope).model_dump(exclude_none=True)
        if entry["scope"] == "read":
            del entry["scope"]
        data["tenants"] = [t for t in data["tenants"] if t.get("name") != name] + [entry]
    return key


def rotate_key(path: str | Path, name: str, scope: str | None = None) -> str:
    """A new key for an existing tenant (with `scope` given, that scope; else the one it had); the old one
    stops working at the servers' next reload."""
    if scope is not None and scope not in SCOPES:
        raise QragError(f"unknown scope {scope!r} (known: {', '.join(SCOPES)})")
    with _editing(path) as data:
        entry = _entry(data, name, path)
        entry["key_sha256"] = hash_key(key := new_key())
        if scope == "write":
            entry["scope"] = "write"
        elif scope == "read":
            entry.pop("scope", None)
    return key


def remove_tenant(path: str | Path, name: str) -> None:
    with _editing(path) as data:
        data["tenants"].remove(_entry(data, name, path))


def set_admin_key(path: str | Path) -> str:
    with _editing(path) as data:
        data["admin_key_sha256"] = hash_key(key := new_key())
    return key


def _write_file(path: Path, data: dict) -> None:
    """Via a temporary sibling renamed over it: a server re-reading it never sees half a file."""
    _TenantsFile.model_validate(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(descriptor, "w") as file:
        file.write("# qrag tenants: keys are stored as sha256 only (qrag tenants add prints a key once)\n")
        yaml.safe_dump(data, file, sort_keys=False)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
