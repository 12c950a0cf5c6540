"""Tenants: who may query which index, with API keys stored only as sha256 (pure, no Ray).

A tenants file is YAML:

    tenants:
      - name: acme
        index: /mnt/qrag/acme-index
        key_sha256: 3f2a...   # sha256 hex of the bearer key; the key itself is shown once by `qrag tenants add`

Each tenant owns exactly one index, named after the tenant, so "which chunks may this key see" is a
single lookup. Without a tenants file the server has one open tenant (`default`) and no keys; that mode
is meant for 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from qrag_ray.errors import QragError
from qrag_ray.serving.errors import ApiError, forbidden, not_found, unauthorized

DEFAULT_TENANT = "default"
KEY_PREFIX = "qrag_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    index: str
    key_sha256: str | None = Field(None, description="sha256 hex of the API key; None only for the open default tenant")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("tenant names are 1-64 characters of letters, digits, '_', '-', '.'")
        return v

    @field_validator("key_sha256")
    @classmethod
    def _hash(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("key_sha256 must be 64 lowercase hex characters (sha256 of the key)")
        return v


class _TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenants: list[Tenant] = Field(default_factory=list)


@dataclass(frozen=True)
class Tenants:
    """The tenant table a router checks every request against."""

    by_name: dict[str, Tenant]
    open: bool  # no keys: the single default tenant answers unauthenticated requests

    @classmethod
    def single(cls, index: str) -> "Tenants":
        return cls({DEFAULT_TENANT: Tenant(name=DEFAULT_TENANT, index=str(index))}, open=True)

    @classmethod
    def from_list(cls, tenants: list[Tenant | dict]) -> "Tenants":
        ts = [t if isinstance(t, Tenant) else Tenant.model_validate(t) for t in tenants]
        if not ts:
            raise QragError("the tenants file lists no tenants")
        names = [t.name for t in ts]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise QragError(f"duplicate tenant names: {', '.join(sorted(dup))}")
        missing = [t.name for t in ts if not t.key_sha256]
        if missing:
            raise QragError(f"tenants without key_sha256: {', '.join(missing)} (create entries with `qrag tenants add`)")
        hashes = [t.key_sha256 for t in ts]
        if len(set(hashes)) != len(hashes):
            raise QragError("two tenants share one API key")
        return cls({t.name: t for t in ts}, open=False)

    def to_list(self) -> list[dict]:
        return [t.model_dump() for t in self.by_name.values()]

    # ---- request checks ----------------------------------------------------------------------
    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant whose key is in `Authorization: Bearer KEY` (401 otherwise)."""
        if self.open:
            return self.by_name[DEFAULT_TENANT]
        if not authorization:
            raise unauthorized("missing API key: send 'Authorization: Bearer KEY'")
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise unauthorized("malformed Authorization header: expected 'Bearer KEY'")
        h = hash_key(key.strip())
        found = None
        for t in self.by_name.values():  # constant-time compare, no early exit on a hash prefix
            if hmac.compare_digest(h, t.key_sha256 or ""):
                found = t
        if found is None:
            raise unauthorized("unknown API key")
        return found

    def resolve(self, tenant: Tenant, index: str | None) -> Tenant:
        """The tenant whose index the request reads: its own; naming another tenant's index is 403."""
        if index is None or index == tenant.name:
            return tenant
        if index in self.by_name:
            raise forbidden(f"this API key may not read index '{index}'")
        raise not_found(f"unknown index '{index}'")


# ---- the tenants file --------------------------------------------------------------------------
def load_tenants(path: str | Path) -> Tenants:
    p = Path(path)
    if not p.is_file():
        raise QragError(f"tenants file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise QragError(f"tenants file {p} is not valid YAML: {e}") from None
    try:
        tf = _TenantsFile.model_validate(data)
    except ValidationError as e:
        from qrag_ray.config import format_validation_error

        raise QragError(f"tenants file {p}: {format_validation_error(e)}") from None
    return Tenants.from_list(tf.tenants)


def add_tenant(path: str | Path, name: str, index: str | Path, key: str | None = None) -> str:
    """Append a tenant (or rotate its key) and return the new key; the file only ever holds its hash."""
    p = Path(path)
    data: dict = {"tenants": []}
    if p.is_file():
        data = yaml.safe_load(p.read_text()) or {"tenants": []}
        _TenantsFile.model_validate(data)
    key = key or new_key()
    entry = Tenant(name=name, index=str(Path(index).resolve()), key_sha256=hash_key(key)).model_dump()
    tenants = [t for t in data.get("tenants", []) if t.get("name") != name] + [entry]
    data["tenants"] = tenants
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    with os.fdopen(fd, "w") as f:
        f.write("# qrag tenants: keys are stored as sha256 only (qrag tenants add prints a key once)\n")
        yaml.safe_dump(data, f, sort_keys=False)
    os.chmod(tmp, 0o600)
    os.replace(tmp, p)
    return key


__all__ = ["ApiError", "DEFAULT_TENANT", "Tenant", "Tenants", "add_tenant", "hash_key", "load_tenants", "new_key"]
