"""How the applier (serving/applier.py) reads a pass's log entries: folded in order into each touched
document's final write (a write that repeats a document's visible content dropped: the no-op rule) and
each entry's outcome; a deletion by filter resolved against what is visible at its turn (the base, the
deltas, the pass's earlier upserts), as the search's filter evaluates it (qrag_ray/search/filters.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qrag_ray.config.index import IndexConfig
from qrag_ray.errors import QragError
from qrag_ray.index.format import CHUNKS, Manifest
from qrag_ray.index.metadata_columns import ARROW_TYPES, METADATA, typed_struct
from qrag_ray.index.write_delta import BaseDocuments, BaseTerms, record_fingerprint
from qrag_ray.index.write_log import LogEntry
from qrag_ray.index.write_state import WriteState
from qrag_ray.io.metadata import to_json, value_type
from qrag_ray.search.filters import InvalidFilter, chunk_mask, compile_filter
from qrag_ray.serving.api_errors import ApiError
from qrag_ray.serving.writes import check_documents


@dataclass
class BaseInfo:
    """A base version as the applier needs it, read once per version."""

    version: str
    manifest: Manifest
    cfg: IndexConfig
    docs: BaseDocuments
    terms: BaseTerms | None
    _filter_table: pa.Table | None = None

    def filter_table(self) -> pa.Table:
        """doc_id and (if any) metadata of every base chunk: what a delete by filter is evaluated on."""
        if self._filter_table is None:
            path = self.manifest.file(CHUNKS)
            cols = ["doc_id"] + ([METADATA] if METADATA in pq.read_schema(path).names else [])
            self._filter_table = pq.read_table(path, columns=cols)
        return self._filter_table


@dataclass
class Fold:
    """The pass's entries folded in order: each touched document's final write, each entry's outcome."""

    schema: dict[str, str]
    pending: dict[str, tuple[int, dict | None]] = field(default_factory=dict)  # doc -> (seq, record | None)
    outcomes: dict[int, dict] = field(default_factory=dict)


def full_struct(table: pa.Table, schema: dict[str, str]) -> pa.StructArray | None:
    """A chunk table's metadata with one child per field of `schema` (nulls where the table lacks one), so a
    filter naming a field only other segments have evaluates to "missing" here."""
    if not schema:
        return None
    n = table.num_rows
    have = table.column(METADATA).combine_chunks() if METADATA in table.column_names else None
    children = []
    for name, typ in schema.items():
        child = None
        if have is not None and have.type.get_field_index(name) >= 0:
            child = have.field(name)
            if child.type != ARROW_TYPES[typ]:
                child = None
        children.append(child if child is not None else pa.nulls(n, ARROW_TYPES[typ]))
    return pa.StructArray.from_arrays(children, fields=[pa.field(f, ARROW_TYPES[t]) for f, t in schema.items()])


class Folder:
    """Folds one pass's entries over `state` and its base; `api_hashes()`: doc -> content hash of the
    documents an earlier compaction took from the API (read only when a write needs it)."""

    def __init__(self, state: WriteState, base: BaseInfo, api_hashes: Callable[[], dict[str, str]]):
        self.state = state
        self.base = base
        self.api_hashes = api_hashes

    def fold(self, entries: list[LogEntry]) -> Fold:
        """The entries in order: each document's final write of the pass (a no-op write dropped), each
        entry's outcome; an entry that cannot apply now (a metadata type another writer's batch took
        first, a filter on a field of another type) fails whole."""
        fold = Fold(schema=dict(self.state.metadata_schema or self.base.manifest.metadata_schema or {}))
        for entry in entries:
            operation = entry.operation if entry.operation in ("upsert", "delete") else "upsert"
            outcome = {"write_id": entry.write_id, "operation": operation, "status": "searchable",
                       "documents": entry.documents, "chunks": None, "indexed": 0,
                       "submitted_at": entry.submitted_at, "searchable_at": None, "error": None}
            fold.outcomes[entry.seq] = outcome
            if entry.error is not None:
                outcome.update(status="failed", error={"record": None, "field": None, "message": entry.error})
                continue
            try:
                if entry.operation == "upsert":
                    self._upsert(fold, entry)
                else:
                    outcome["documents"] = self._delete(fold, entry)
            except ApiError as err:
                loc = (err.detail or [{}])[0].get("loc") or []
                outcome.update(status="failed", error={
                    "record": loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None,
                    "field": ".".join(str(x) for x in loc[2:]) or None, "message": err.message})
            except QragError as err:
                outcome.update(status="failed", error={"record": None, "field": None, "message": str(err)})
        return fold

    def _visible_hash(self, fold: Fold, doc: str) -> str | None:
        """The content hash of `doc`'s visible version as the write path knows it (None: deleted, absent,
        or a document of the batch-built base, compared by its chunks instead)."""
        if doc in fold.pending:
            rec = fold.pending[doc][1]
            return None if rec is None else rec["hash"]
        if doc in self.state.tombstones:
            return self.state.hashes.get(doc)
        return self.api_hashes().get(doc)

    def _is_visible(self, fold: Fold, doc: str) -> bool:
        if doc in fold.pending:
            return fold.pending[doc][1] is not None
        if doc in self.state.tombstones:
            return doc in self.state.hashes
        return doc in self.base.docs

    def _upsert(self, fold: Fold, entry: LogEntry) -> None:
        docs = [{"id": r["doc_id"], "title": r.get("title") or "", "text": r["text"], "url": r.get("url") or None,
                 "metadata": r.get("metadata") or {}} for r in entry.records or []]
        records = check_documents(docs, fold.schema)  # the schema as this entry's turn finds it
        for rec in records:
            for name, value in rec["metadata"].items():
                fold.schema.setdefault(name, value_type(value))
        for rec in records:
            doc = rec["doc_id"]
            if self._visible_hash(fold, doc) == rec["hash"]:
                continue  # the same document again: nothing to do
            batch_built = (doc not in fold.pending and doc not in self.state.tombstones and doc in self.base.docs
                           and not self.api_hashes().get(doc))
            if batch_built and self.base.docs.fingerprint(doc) == record_fingerprint(rec, self.base.cfg, fold.schema):
                continue  # the batch-built document, written again as it is
            fold.pending[doc] = (entry.seq, rec)

    def _delete(self, fold: Fold, entry: LogEntry) -> int:
        if entry.ids is not None:
            docs = [d for d in dict.fromkeys(entry.ids) if self._is_visible(fold, d)]
        else:
            try:
                docs = sorted(self._matching(fold, compile_filter(entry.filter, None, fold.schema)))
            except InvalidFilter as err:
                raise QragError(f"the filter cannot be applied: {err}") from None
        for doc in docs:
            fold.pending[doc] = (entry.seq, None)
        return len(docs) if entry.ids is None else len(entry.ids)

    def _matching(self, fold: Fold, flt) -> set[str]:
        """The documents visible now (base, deltas, this pass's earlier upserts) whose metadata passes."""
        hits: set[str] = set()
        segments = [(self.base.filter_table(), self.state.base_seq)]
        segments += [(pq.read_table(d.path / CHUNKS, columns=["doc_id"] + (
            [METADATA] if METADATA in pq.read_schema(d.path / CHUNKS).names else [])), d.last_seq)
            for d in self.state.deltas]
        for table, seq in segments:
            ids = table.column("doc_id").combine_chunks()
            mask = chunk_mask(flt, ids, full_struct(table, fold.schema))
            for doc in set(np.asarray(ids.to_pylist(), dtype=object)[mask].tolist()):
                if doc not in fold.pending and self.state.visible(doc, seq):
                    hits.add(doc)
        live = [(d, rec) for d, (_, rec) in fold.pending.items() if rec is not None]
        if live:
            meta = pa.table({"doc_id": [d for d, _ in live],
                             METADATA: typed_struct([to_json(rec["metadata"]) for _, rec in live], fold.schema)})
            mask = chunk_mask(flt, meta.column("doc_id").combine_chunks(), meta.column(METADATA).combine_chunks())
            hits.update(d for (d, _), hit in zip(live, mask, strict=True) if hit)
        return hits
