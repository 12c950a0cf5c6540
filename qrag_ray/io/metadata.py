"""Document metadata values (pure): a record's `metadata` checked and typed, one type per field across the
corpus (the schema an index's manifest records). Between the build's stages a document's metadata
travels as one canonical JSON string (dates as ISO-8601 text), so every stage and batch types a value by
the same rule (`value_type`); qrag_ray.index.metadata_columns stores it as typed Arrow columns."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from qrag_ray.errors import QragError

TYPES = ("string", "number", "bool", "date", "datetime", "string_list")
TYPE_NAMES = {"string": "a string", "number": "a number", "bool": "a bool", "date": "a date",
              "datetime": "a datetime", "string_list": "a list of strings"}
MAX_FIELDS = 256  # fields per index: each is a column of every shard's chunk table
MAX_NAME_CHARS = 128
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:?\d{2})?$")


def parse_date(text: str) -> dt.date | None:
    """An ISO-8601 calendar date (YYYY-MM-DD), else None."""
    if not _DATE.match(text):
        return None
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def parse_datetime(text: str) -> dt.datetime | None:
    """An ISO-8601 date and time as UTC (no offset: UTC), else None."""
    if not _DATETIME.match(text):
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.replace(tzinfo=dt.timezone.utc) if parsed.tzinfo is None else parsed.astimezone(dt.timezone.utc)


def iso(value: dt.date) -> str:
    """A date or datetime as the API writes it: YYYY-MM-DD, or UTC with a Z."""
    if isinstance(value, dt.datetime):
        value = value.astimezone(dt.timezone.utc) if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return value.isoformat().replace("+00:00", "Z")
    return value.isoformat()


def value_type(value: Any) -> str:
    """The type of a normalized value (`normalize_metadata`): a string that is an ISO-8601 date or
    datetime is one."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, list):
        return "string_list"
    if _DATE.match(value):
        return "date"
    return "datetime" if _DATETIME.match(value) else "string"


def _value(raw: Any, what: str) -> Any:
    """One raw value -> its JSON form (None: absent); QragError for a value of no supported type."""
    if raw is None or isinstance(raw, (bool, str)):
        looks_dated = isinstance(raw, str) and (_DATE.match(raw) or _DATETIME.match(raw))
        if looks_dated and not (parse_date(raw) or parse_datetime(raw)):
            raise QragError(f"{what}: {raw!r} is not a valid ISO-8601 date")
        return raw
    if isinstance(raw, (int, float, np.integer, np.floating)) and not isinstance(raw, np.bool_):
        if not math.isfinite(float(raw)):
            raise QragError(f"{what}: {raw!r} is not a finite number")
        return int(raw) if isinstance(raw, (int, np.integer)) else float(raw)
    if isinstance(raw, np.bool_):
        return bool(raw)
    if isinstance(raw, dt.date):  # Parquet date and timestamp columns
        return iso(raw)
    if isinstance(raw, (list, tuple, np.ndarray)) and all(isinstance(x, str) for x in raw):
        return [str(x) for x in raw]
    raise QragError(f"{what}: values must be a string, number, bool, ISO-8601 date or list of strings, "
                    f"got {type(raw).__name__}")


def normalize_metadata(meta: Any, where: str) -> dict[str, Any]:
    """A record's `metadata` (an object; a Parquet map column's key-value pairs too) -> {field: value} in
    its JSON form, absent (null) values dropped. `where` names the record in the error."""
    if meta is None:
        return {}
    if isinstance(meta, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in meta):
        meta = dict(meta)
    if not isinstance(meta, dict):
        raise QragError(f"{where}: 'metadata' must be an object of field: value, got {type(meta).__name__}")
    out = {}
    for name, raw in meta.items():
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise QragError(f"{where}: metadata field name {str(name)[:40]!r} must be 1..{MAX_NAME_CHARS} "
                            "printable characters")
        value = _value(raw, f"{where}: metadata field {name!r}")
        if value is not None:
            out[name] = value
    return out


def to_json(meta: dict[str, Any]) -> str:
    """The canonical JSON a document's metadata travels as ("" for none)."""
    return json.dumps(meta, sort_keys=True, ensure_ascii=False, separators=(",", ":")) if meta else ""


def conflict(field: str, doc: str, typ: str, first_doc: str, first_typ: str) -> QragError:
    return QragError(f"document {doc!r}: metadata field {field!r} is {TYPE_NAMES[typ]}, but document {first_doc!r} "
                     f"has it as {TYPE_NAMES[first_typ]} (one type per field)")


def field_types(docs: Iterable[tuple[str, dict]], seen: dict[str, list] | None = None) -> dict[str, list]:
    """{field: [type, first document]} over (doc_id, normalized metadata) pairs, added to `seen`;
    QragError naming both documents and types when one disagrees."""
    seen = {} if seen is None else seen
    for doc, meta in docs:
        for name, value in meta.items():
            typ = value_type(value)
            first = seen.setdefault(name, [typ, doc])
            if first[0] != typ:
                raise conflict(name, doc, typ, first[1], first[0])
    if len(seen) > MAX_FIELDS:
        raise QragError(f"the corpus has {len(seen)} metadata fields; at most {MAX_FIELDS} are indexed")
    return seen


def merge_field_types(parts: Iterable[dict[str, list]]) -> dict[str, str]:
    """The corpus's schema {field: type} (sorted by name) from each part's `field_types`."""
    seen: dict[str, list] = {}
    for part in parts:
        for name, (typ, doc) in sorted(part.items()):
            first = seen.setdefault(name, [typ, doc])
            if first[0] != typ:
                raise conflict(name, doc, typ, first[1], first[0])
    if len(seen) > MAX_FIELDS:
        raise QragError(f"the corpus has {len(seen)} metadata fields; at most {MAX_FIELDS} are indexed")
    return {name: seen[name][0] for name in sorted(seen)}
