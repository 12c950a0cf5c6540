"""Metadata filters (OpenAI vector-store grammar): a request's `filter` and `doc_ids` checked once against
an index's metadata schema (`compile_filter`), then evaluated on each shard's chunk table in one vectorised
pass of pyarrow.compute (`chunk_mask`): the search's pre-filter (docs/SERVING.md, "Filters")."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from qrag_ray.errors import QragError
from qrag_ray.index.metadata_columns import ARROW_TYPES
from qrag_ray.io.metadata import TYPE_NAMES, parse_date, parse_datetime

MAX_FILTER_DEPTH = 8  # nesting of and/or
MAX_IN_VALUES = 1000  # values of one in/nin
MAX_FILTER_CLAUSES = 100  # comparisons in one filter, and filters in one and/or
MAX_DOC_IDS = 1000
COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte")
SETS = ("in", "nin")
COMPOUNDS = ("and", "or")
_RANGE = ("gt", "gte", "lt", "lte")
# the operators each field type takes (a list-of-strings field: eq/in match when any element does)
OPERATORS = {"string": COMPARISONS + SETS, "number": COMPARISONS + SETS, "date": COMPARISONS + SETS,
             "datetime": COMPARISONS + SETS, "bool": ("eq", "ne"), "string_list": ("eq", "ne") + SETS}


class InvalidFilter(QragError):
    """A filter this index cannot evaluate (HTTP 422 `invalid_filter`)."""


@dataclass(frozen=True)
class Filter:
    """A checked filter: `tree` is ("cmp", op, field, type, value) or (and|or, (children...)), values
    typed as the field's column (a tuple for in/nin); `doc_ids` ANDed with it. Hashable: queries with
    equal filters share a search batch."""

    tree: tuple | None
    doc_ids: tuple[str, ...] | None


def compile_filter(spec: Any, doc_ids: Any, schema: dict[str, str] | None) -> Filter | None:
    """The request's `filter` (a dict in the grammar) and `doc_ids` against the index's metadata schema
    ({field: type}); None when neither is given. InvalidFilter names what is wrong in one line."""
    if doc_ids is not None:
        if not isinstance(doc_ids, (list, tuple)) or not all(isinstance(d, str) for d in doc_ids):
            raise InvalidFilter("doc_ids must be a list of document id strings")
        if len(doc_ids) > MAX_DOC_IDS:
            raise InvalidFilter(f"doc_ids has {len(doc_ids)} ids; at most {MAX_DOC_IDS}")
    if spec is None:
        return None if doc_ids is None else Filter(None, tuple(dict.fromkeys(doc_ids)))
    if not schema:
        raise InvalidFilter("this index was built without document metadata, so there is nothing to filter on "
                            "(doc_ids still selects documents); re-index documents with a 'metadata' object")
    count = [0]
    tree = _compile(spec, schema, 1, count)
    return Filter(tree, None if doc_ids is None else tuple(dict.fromkeys(doc_ids)))


def _compile(node: Any, schema: dict[str, str], depth: int, count: list[int]) -> tuple:
    if not isinstance(node, dict):
        raise InvalidFilter(f"a filter is an object with a 'type', got {type(node).__name__}")
    kind = node.get("type")
    if kind in COMPOUNDS:
        if depth > MAX_FILTER_DEPTH:
            raise InvalidFilter(f"the filter nests and/or deeper than {MAX_FILTER_DEPTH} levels")
        _keys(node, {"type", "filters"})
        subs = node.get("filters")
        if not isinstance(subs, list) or not subs or len(subs) > MAX_FILTER_CLAUSES:
            raise InvalidFilter(f"'{kind}' needs 'filters': a list of 1..{MAX_FILTER_CLAUSES} filters")
        return (kind, tuple(_compile(s, schema, depth + 1, count) for s in subs))
    if kind not in COMPARISONS + SETS:
        raise InvalidFilter(f"unknown filter type {kind!r} (known: {', '.join(COMPARISONS + SETS + COMPOUNDS)})")
    _keys(node, {"type", "key", "value"})
    count[0] += 1
    if count[0] > MAX_FILTER_CLAUSES:
        raise InvalidFilter(f"the filter has more than {MAX_FILTER_CLAUSES} comparisons")
    key = node.get("key")
    if not isinstance(key, str) or key not in schema:
        fields = sorted(schema)
        shown = ", ".join(fields[:30]) + (f", ... ({len(fields)} in all)" if len(fields) > 30 else "")
        raise InvalidFilter(f"unknown metadata field {key!r}; this index has: {shown}")
    typ = schema[key]
    if kind not in OPERATORS[typ]:
        raise InvalidFilter(f"'{kind}' does not apply to field {key!r}, which is {TYPE_NAMES[typ]} "
                            f"(it takes {', '.join(OPERATORS[typ])})")
    value = node.get("value")
    if kind in SETS:
        if not isinstance(value, list) or len(value) > MAX_IN_VALUES:
            raise InvalidFilter(f"'{kind}' on {key!r} needs 'value': a list of at most {MAX_IN_VALUES} values")
        return ("cmp", kind, key, typ, tuple(dict.fromkeys(_typed(v, typ, key) for v in value)))
    return ("cmp", kind, key, typ, _typed(value, typ, key))


def _keys(node: dict, allowed: set[str]) -> None:
    extra = sorted(set(node) - allowed)
    if extra:
        raise InvalidFilter(f"unknown key(s) {', '.join(map(repr, extra))} in a {node.get('type')!r} filter "
                            f"(it takes {', '.join(sorted(allowed))})")
    missing = sorted(allowed - set(node))
    if missing:
        raise InvalidFilter(f"a {node.get('type')!r} filter needs {', '.join(map(repr, missing))}")


def _typed(value: Any, typ: str, key: str) -> Any:
    """A filter value as the field's column type; InvalidFilter when it cannot be one."""
    if typ == "bool":
        if isinstance(value, bool):
            return value
    elif typ == "number":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
            return float(value)
    elif typ in ("string", "string_list"):
        if isinstance(value, str):
            return value
    elif isinstance(value, str):  # date / datetime: ISO-8601 text
        got = parse_date(value) if typ == "date" else parse_datetime(value) or _midnight(parse_date(value))
        if got is None:
            want = "YYYY-MM-DD" if typ == "date" else "YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][Z|+HH:MM]"
            raise InvalidFilter(f"field {key!r} is {TYPE_NAMES[typ]}; {value!r} is not an ISO-8601 {typ} ({want})")
        return got
    raise InvalidFilter(f"field {key!r} is {TYPE_NAMES[typ]}; the value {value!r} is not "
                        f"{'an ISO-8601 ' + typ + ' string' if typ in ('date', 'datetime') else TYPE_NAMES[typ]}")


def _midnight(day: dt.date | None) -> dt.datetime | None:
    return None if day is None else dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc)


# ---------------------------------------------------------------------------------------------- evaluation
_CMP = {"eq": pc.equal, "ne": pc.equal, "gt": pc.greater, "gte": pc.greater_equal, "lt": pc.less,
        "lte": pc.less_equal}


def chunk_mask(flt: Filter, doc_id: pa.Array, metadata: pa.StructArray | None) -> np.ndarray:
    """Which chunks of a shard's chunk table pass `f` (bool per chunk): one vectorised evaluation. A
    missing value fails every comparison but ne / nin, which are the negations of eq / in."""
    n = len(doc_id)
    mask = np.ones(n, bool) if flt.tree is None else _eval(flt.tree, metadata, n)
    if flt.doc_ids is not None:
        mask &= _bools(pc.is_in(doc_id, value_set=pa.array(flt.doc_ids, pa.string())))
    return mask


def _bools(arr) -> np.ndarray:
    """A compute kernel's boolean result as numpy, a null (a missing value) as False."""
    arr = arr if arr.null_count == 0 else pc.fill_null(arr, False)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=bool)


def _eval(node: tuple, metadata: pa.StructArray | None, n: int) -> np.ndarray:
    if node[0] in COMPOUNDS:
        parts = [_eval(c, metadata, n) for c in node[1]]
        return np.logical_and.reduce(parts) if node[0] == "and" else np.logical_or.reduce(parts)
    _, operator, key, typ, value = node
    col = metadata.field(key) if metadata is not None else pa.nulls(n, ARROW_TYPES[typ])
    if typ == "string_list":  # any element matches (eq / in), none does (ne / nin)
        values = pa.array([value] if operator in ("eq", "ne") else list(value), pa.string())
        hit = _bools(pc.is_in(pc.list_flatten(col), value_set=values))
        any_hit = np.zeros(n, bool)
        any_hit[np.asarray(pc.list_parent_indices(col).to_numpy())[hit]] = True
        return ~any_hit if operator in ("ne", "nin") else any_hit
    if operator in SETS:
        hit = _bools(pc.is_in(col, value_set=pa.array(list(value), ARROW_TYPES[typ])))
        return ~hit if operator == "nin" else hit
    hit = _bools(_CMP[operator](col, pa.scalar(value, ARROW_TYPES[typ])))
    return ~hit if operator == "ne" else hit
