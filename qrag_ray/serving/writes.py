"""The write routes' work inside a Router replica (docs/SERVING.md, "Writing to a tenant"), no Serve needed:
a batch checked against the tenant's index (its input schema, its metadata types, the bounds), appended
to the tenant's write-ahead log (qrag_ray/index/write_log.py: durable before the 202), and a write's
status read back from the log, the write state and the applier's records, so any Router replica answers
for any write. Nothing of a bad batch is logged. Blocking file work: the routes run these in a thread."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

from qrag_ray.errors import QragError
from qrag_ray.index.format import Manifest
from qrag_ray.index.versions import is_versioned_root, resolve_index
from qrag_ray.index.write_delta import record_hash, writable_reason
from qrag_ray.index.write_log import LogEntry, WriteLog, parse_write_id, writes_dir
from qrag_ray.index.write_state import WriteState, read_write_state
from qrag_ray.io.metadata import MAX_FIELDS, TYPE_NAMES, normalize_metadata, value_type
from qrag_ray.search.filters import InvalidFilter, compile_filter
from qrag_ray.serving.api_errors import (
    ApiError,
    index_unavailable,
    invalid_document,
    not_writable,
    too_large,
    write_backlog,
)
from qrag_ray.serving.config import WriteSettings
from qrag_ray.serving.tenants import Tenant

logger = logging.getLogger("ray.serve")

APPLYING = "APPLYING"  # the applier's current batch: {first, last, chunks, indexed, started_at}
STATUS = "status"  # the applier's outcome per applied batch: status/<first>-<last>.json
BACKLOG_RETRY_S = 5
OUTCOME_FILES_KEPT = 256


def applying_path(root: str | Path) -> Path:
    return writes_dir(root) / APPLYING


def status_dir(root: str | Path) -> Path:
    return writes_dir(root) / STATUS


class TenantWrites:
    """The write routes of one Router replica over its tenants' roots; `writer` is the Writer deployment's
    handle, told of each logged batch."""

    def __init__(self, settings: WriteSettings, writer=None):
        self.settings = settings
        self.writer = writer
        self._nudges: set[asyncio.Task] = set()
        self._logs: dict[str, WriteLog] = {}
        # a status file's path -> its parsed outcomes (the applier writes each once): the newest few
        self._outcomes: OrderedDict[str, dict] = OrderedDict()

    def nudge(self, tenant: Tenant) -> None:
        """Tell the Writer a batch of `tenant` is logged; not waited for (its scan finds the batch anyway)."""
        if self.writer is None:
            return
        task = asyncio.get_running_loop().create_task(self._send_nudge(tenant.index))
        self._nudges.add(task)
        task.add_done_callback(self._nudges.discard)

    async def _send_nudge(self, root: str) -> None:
        try:
            await self.writer.nudge.remote(root)
        except Exception:
            logger.warning("could not nudge the Writer for %s", root, exc_info=True)

    def log(self, root: Path) -> WriteLog:
        key = str(root)
        if key not in self._logs:
            self._logs[key] = WriteLog(root)
        return self._logs[key]

    # ---- where a tenant's writes go ----------------------------------------------------------------
    def writable(self, tenant: Tenant) -> tuple[Path, Manifest, WriteState | None]:
        """(the tenant's index root, the version's manifest, its write state); 409 for an index that
        cannot take writes, 503 for one that cannot be read."""
        root = Path(tenant.index)
        if not is_versioned_root(root):
            raise not_writable(tenant.name, f"{root} is a plain index directory; writes need a versioned root "
                               f"(`qrag publish {root} --root NEWROOT`, then point the tenant at NEWROOT)")
        try:
            resolved = resolve_index(root)
            state = read_write_state(root)
        except QragError as error:
            raise index_unavailable(tenant.name, str(error)) from None
        why = writable_reason(resolved.manifest)
        if why:
            raise not_writable(tenant.name, why)
        return root, resolved.manifest, state

    @staticmethod
    def schema(manifest: Manifest, state: WriteState | None) -> dict[str, str]:
        """The metadata schema writes are checked against: the base's and the deltas' fields."""
        return dict((state.metadata_schema if state and state.metadata_schema else manifest.metadata_schema) or {})

    def _check_room(self, tenant: Tenant, root: Path, state: WriteState | None, nbytes: int) -> None:
        queued = self.log(root).pending_bytes(state.generation if state else 0)
        limit = self.settings.max_queued_bytes
        if queued and queued + nbytes > limit:
            raise write_backlog(tenant.name, queued, limit, BACKLOG_RETRY_S)

    def _check_size(self, count: int, nbytes: int) -> None:
        settings = self.settings
        if count > settings.max_documents:
            raise too_large(f"the request carries {count} documents; at most {settings.max_documents} per request")
        if nbytes > settings.max_bytes:
            raise too_large(f"the request body has {nbytes} bytes; at most {settings.max_bytes} per request")

    # ---- routes ------------------------------------------------------------------------------------
    def upsert(self, tenant: Tenant, documents: list[dict[str, Any]], nbytes: int) -> LogEntry:
        """Check the documents and log them as one batch (422 naming the record and field; 413; 429)."""
        self._check_size(len(documents), nbytes)
        root, manifest, state = self.writable(tenant)
        records = check_documents(documents, self.schema(manifest, state))
        self._check_room(tenant, root, state, nbytes)
        return self._append(tenant, root, "upsert", {"records": records})

    def delete(self, tenant: Tenant, ids: list[str] | None, filter_spec: dict | None, nbytes: int) -> LogEntry:
        """Log a deletion by ids or by a filter (checked against the index's fields: 422 invalid_filter)."""
        self._check_size(len(ids or []), nbytes)
        root, manifest, state = self.writable(tenant)
        if filter_spec is not None:
            try:
                compile_filter(filter_spec, None, self.schema(manifest, state))
            except InvalidFilter as error:
                raise ApiError(422, "invalid_filter", str(error)) from None
        self._check_room(tenant, root, state, nbytes)
        payload = {"ids": list(dict.fromkeys(ids))} if ids is not None else {"filter": filter_spec}
        return self._append(tenant, root, "delete", payload)

    def _append(self, tenant: Tenant, root: Path, operation: str, payload: dict) -> LogEntry:
        try:
            return self.log(root).append(operation, payload)
        except OSError as error:
            reason = f"its write log cannot be written ({error.strerror or error})"
            raise index_unavailable(tenant.name, reason) from None

    def status(self, tenant: Tenant, write_id: str) -> dict[str, Any]:
        """The WriteStatus body of one of the tenant's writes (404 for an id it does not have)."""
        parsed = parse_write_id(write_id)
        missing = ApiError(404, "not_found", f"no write {write_id!r} in index '{tenant.name}' (unknown, or older "
                                             "than the status retention)")
        if parsed is None:
            raise missing
        seq, _ = parsed
        root = Path(tenant.index)
        state = read_write_state(root) if is_versioned_root(root) else None
        generation = state.generation if state else 0
        if seq <= generation:
            outcome = self._outcome(root, seq)
            if outcome is not None and outcome.get("write_id") == write_id:
                return {"index": tenant.name, **outcome}
        entry = self.log(root).read(seq)
        if entry is None or entry.write_id != write_id:
            raise missing
        body = {"write_id": write_id, "index": tenant.name, "operation": entry.operation, "status": "queued",
                "documents": entry.documents, "chunks": None, "indexed": 0, "submitted_at": entry.submitted_at,
                "searchable_at": None, "error": None}
        if seq <= generation:  # applied, its record not written (the applier stopped between the two)
            return {**body, "status": "searchable", "searchable_at": state.updated_at}
        applying = _read_json(applying_path(root))
        if applying and applying.get("first", 0) <= seq <= applying.get("last", -1):
            body.update(status="indexing", chunks=applying.get("chunks"), indexed=int(applying.get("indexed", 0)))
        return body

    def _outcome(self, root: Path, seq: int) -> dict | None:
        folder = status_dir(root)
        try:
            names = sorted(folder.iterdir())
        except FileNotFoundError:
            return None
        for path in names:
            span = _span(path.name)
            if span is None or not span[0] <= seq <= span[1]:
                continue
            key = str(path)
            if key not in self._outcomes:
                data = _read_json(path)
                if data is None:
                    continue
                self._outcomes[key] = data.get("writes") or {}
                while len(self._outcomes) > OUTCOME_FILES_KEPT:
                    self._outcomes.popitem(last=False)
            return self._outcomes[key].get(str(seq))
        return None


def _span(name: str) -> tuple[int, int] | None:
    stem = name.removesuffix(".json")
    first, sep, last = stem.partition("-")
    if not (sep and name.endswith(".json") and first.isdigit() and last.isdigit()):
        return None
    return int(first), int(last)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def check_documents(documents: list[dict[str, Any]], schema: dict[str, str]) -> list[dict[str, Any]]:
    """The documents of one write as log records ({doc_id, title, text, url, metadata, hash}), or 422
    invalid_document naming the first bad record's position and field: a repeated id, a metadata value of
    no supported type, a field of another type than the index (or an earlier record of the batch) has."""
    seen: dict[str, int] = {}
    types: dict[str, tuple[str, int | None]] = {name: (typ, None) for name, typ in schema.items()}
    records = []
    for i, doc in enumerate(documents):
        doc_id = doc["id"]
        if doc_id in seen:
            raise invalid_document(i, "id", f"id {doc_id!r} repeats record {seen[doc_id]} (one record per "
                                            "document in a batch)")
        seen[doc_id] = i
        try:
            meta = normalize_metadata(doc.get("metadata") or {}, f"id {doc_id!r}")
        except QragError as error:
            bad = next((f for f in (doc.get("metadata") or {}) if f"field {f!r}" in str(error)), None)
            raise invalid_document(i, f"metadata.{bad}" if bad else "metadata", str(error)) from None
        for name, value in meta.items():
            typ = value_type(value)
            first = types.setdefault(name, (typ, i))
            if first[0] != typ:
                had = "the index has it" if first[1] is None else f"record {first[1]} has it"
                raise invalid_document(i, f"metadata.{name}", f"metadata field {name!r} is {TYPE_NAMES[typ]}, but "
                                       f"{had} as {TYPE_NAMES[first[0]]} (one type per field)")
        if len(types) > MAX_FIELDS:
            raise invalid_document(i, "metadata", f"the index would have {len(types)} metadata fields; at most "
                                                  f"{MAX_FIELDS} are indexed")
        title = doc.get("title") or ""
        url = doc.get("url") or ""
        records.append({"doc_id": doc_id, "title": title, "text": doc["text"], "url": url, "metadata": meta,
                        "hash": record_hash(doc_id, title, doc["text"], url, meta)})
    return records


def receipt(tenant: Tenant, entry: LogEntry) -> dict[str, Any]:
    """The 202 body of a logged batch."""
    return {"write_id": entry.write_id, "index": tenant.name, "operation": entry.operation, "status": "queued",
            "documents": entry.documents}
