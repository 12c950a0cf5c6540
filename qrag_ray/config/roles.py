"""The role of each config field, declared once beside its class, and a config dump cut by role.

spec (the default, so a new knob can only cost a rebuild): decides the index's vectors and files. corpus:
which documents go in (not in the checkpoints' key: rows are keyed by content). search: the query-time
policy. run: where the output goes and how fast the build runs. preset: a search knob a user's file sets
only under `search.experimental:`. A section's role covers all of it, so IndexConfig's structure carries
the roles (`build` is run, `search` search); `generator` alone mixes spec and run fields."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """The base of every config section: an unknown key is an error, not a silently ignored typo."""

    model_config = ConfigDict(extra="forbid")


ROLES = ("spec", "corpus", "search", "run", "preset")
_DECLARED: dict[type, dict[str, str]] = {}


def field_roles(**by_role: Iterable[str]):
    """Class decorator: `@field_roles(run=("batch_size", ...))`; fields it does not name are `spec`."""
    if unknown := set(by_role) - set(ROLES):
        raise ValueError(f"unknown field role(s) {sorted(unknown)} (known: {', '.join(ROLES)})")

    def mark(cls: type[BaseModel]) -> type[BaseModel]:
        roles = {name: role for role, names in by_role.items() for name in names}
        if missing := sorted(set(roles) - set(cls.model_fields)):
            raise ValueError(f"{cls.__name__} has no field(s) {missing} to give a role")
        _DECLARED[cls] = roles
        return cls

    return mark


def role_of(cls: type[BaseModel], name: str) -> str:
    """A field's declared role; a subclass inherits the roles its bases declared."""
    return next((_DECLARED[k][name] for k in cls.__mro__ if name in _DECLARED.get(k, {})), "spec")


def select(cls: type[BaseModel], dump: Mapping[str, Any], keep: Iterable[str]) -> dict[str, Any]:
    """The fields of a `cls` dump whose role is in `keep`; spec sections are cut field by field. A key
    the model does not know (a field an older release wrote) is kept as spec: it can only make two
    configs differ."""
    keep = set(keep)
    out: dict[str, Any] = {}
    for name, value in dump.items():
        if (role := role_of(cls, name)) not in keep:
            continue
        field = cls.model_fields.get(name)
        sub = field.annotation if field is not None and role == "spec" else None
        section = isinstance(sub, type) and issubclass(sub, BaseModel) and isinstance(value, Mapping)
        out[name] = select(sub, value, keep) if section else value
    return out
