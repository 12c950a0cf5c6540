"""A shard's document metadata as typed Arrow columns beside its chunks (`url`, and `metadata`: a struct
with one child per field of the index's schema), built from the JSON the build carries
(qrag_ray.io.metadata) and read back as the API returns it. A table holds them only when some document
has them: an index without metadata has the chunk tables it had before."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from qrag_ray.io.metadata import iso, parse_date, parse_datetime

ARROW_TYPES = {"string": pa.string(), "number": pa.float64(), "bool": pa.bool_(), "date": pa.date32(),
               "datetime": pa.timestamp("us", tz="UTC"), "string_list": pa.list_(pa.string())}
URL = "url"
METADATA = "metadata"


def _arrow_value(value: Any, typ: str) -> Any:
    if typ == "date":
        return parse_date(value)
    if typ == "datetime":
        return parse_datetime(value)
    return float(value) if typ == "number" else value


def typed_struct(json_texts: Iterable[str | None], schema: dict[str, str]) -> pa.StructArray:
    """The `metadata` column of some chunks: one typed child per field of `schema`, null where a chunk's
    document lacks it."""
    metas = [json.loads(t) if t else {} for t in json_texts]
    children = [pa.array([_arrow_value(m[f], typ) if f in m else None for m in metas], ARROW_TYPES[typ])
                for f, typ in schema.items()]
    return pa.StructArray.from_arrays(children, fields=[pa.field(f, ARROW_TYPES[t]) for f, t in schema.items()])


def schema_of(column_type: pa.DataType) -> dict[str, str]:
    """{field: type} of a chunk table's `metadata` struct column."""
    by_arrow = {str(t): name for name, t in ARROW_TYPES.items()}
    return {f.name: by_arrow[str(f.type)] for f in column_type}


def json_values(rows: list[dict]) -> list[dict[str, Any]]:
    """The `metadata` struct's values (`to_pylist`) as the API returns them: absent fields left out,
    dates as ISO-8601 text, whole numbers as integers."""
    out = []
    for row in rows:
        meta = {}
        for name, value in (row or {}).items():
            if value is None:
                continue
            if isinstance(value, dt.date):
                value = iso(value)
            elif isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
                value = int(value)
            meta[name] = value
        out.append(meta)
    return out


def chunk_table(parts: pa.Table, schema: dict[str, str] | None = None, url: bool = False) -> pa.Table:
    """Chunk-part rows (url and metadata as text) -> the published chunk table: the chunk columns, then
    `url` when some document has one and the typed `metadata` when the corpus has fields."""
    out = parts.drop_columns([URL, METADATA])
    if url:
        out = out.append_column(URL, pc.if_else(pc.equal(parts.column(URL), ""), None, parts.column(URL)))
    if schema:
        out = out.append_column(METADATA, typed_struct(parts.column(METADATA).to_pylist(), schema))
    return out
