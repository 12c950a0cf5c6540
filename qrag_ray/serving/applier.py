"""The applier of tenants' writes (docs/SERVING.md, "Writing to a tenant"; run by the Writer deployment,
serving/writer.py): every pending entry of a tenant's log, in order, folded into ONE delta index built in process
through the tenant's own representation (qrag_ray/index/write_delta.py), then the tenant's write state
published atomically (qrag_ray/index/write_state.py). Deletions and replacements are tombstones; a
repeated write (same id and content) changes nothing; small deltas merge into bigger ones.

A batch is applied whole or not at all: nothing is visible before the STATE file is renamed into place,
and a crash before that leaves the log as it was, so a restarted applier builds the same delta again
(over whatever a crashed attempt left) and every logged write is applied exactly once. One applier per
root at a time (a file lock), so a replacement Writer replica cannot race the old one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path


from qrag_ray.config.index import IndexConfig
from qrag_ray.index.format import atomic_write_text, load_manifest
from qrag_ray.index.versions import current_version_name, is_versioned_root
from qrag_ray.index.write_delta import (BaseDocuments, BaseTerms, DeltaEmbedder, DeltaRows, delta_config, delta_input,
                                        embed_input, read_delta_rows, write_delta)
from qrag_ray.index.write_log import WriteLog, writes_dir
from qrag_ray.index.write_state import (APPLY_LOCK, COMPACT_LOCK, DELTAS, STATE_LOCK, Delta, WriteState, delta_name,
                                        is_locked, load_write_state, locked, publish_state)
from qrag_ray.index.write_corpus import read_corpus_records
from qrag_ray.io.metadata import merge_field_types
from qrag_ray.serving.config import WriteSettings
from qrag_ray.serving.write_fold import BaseInfo, Fold, Folder
from qrag_ray.serving.writes import applying_path, status_dir

logger = logging.getLogger("ray.serve")

PROGRESS_EVERY_S = 0.25  # how often the applying batch's progress file is rewritten while it embeds
MAINTAIN_EVERY_S = 30.0  # retired deltas, leftovers and old statuses are swept at most this often per root
TEMP_AGE_S = 3600.0  # a log temporary this old is a crashed writer's


@dataclass
class ApplyResult:
    """What one apply pass did to a root."""

    root: str
    first: int = 0
    last: int = 0
    entries: int = 0
    documents: int = 0
    chunks: int = 0
    deleted: int = 0
    failed: int = 0
    delta: str | None = None
    merged: int = 0
    seconds: float = 0.0
    more: bool = False  # entries were left for the next pass (max_entries)
    retry: bool = False  # a compaction changed the state meanwhile: the pass was dropped, run it again


class Applier:
    """Applies the pending log entries of tenant roots. Thread-safe: roots in parallel, one embedder
    per model (its forward passes one at a time)."""

    def __init__(self, settings: WriteSettings, threads: int = 1):
        self.settings = settings
        self.threads = threads
        self._embedders: dict[tuple, tuple[DeltaEmbedder, threading.Lock]] = {}
        self._bases: OrderedDict[tuple[str, str], BaseInfo] = OrderedDict()
        self._corpus_hashes: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._maintained: dict[str, float] = {}

    # ---- what the passes share --------------------------------------------------------------------
    def _embedder(self, cfg: IndexConfig) -> tuple[DeltaEmbedder, threading.Lock]:
        run = cfg.build.embedder
        key = (cfg.embedder.model, cfg.embedder.max_seq_length, cfg.embedder.dtype, run.backend, run.batch_size,
               run.tokens_per_batch)
        with self._lock:
            if key not in self._embedders:
                self._embedders[key] = (DeltaEmbedder(cfg, threads=self.threads), threading.Lock())
            return self._embedders[key]

    def _base(self, root: Path, version: str) -> BaseInfo:
        key = (str(root), version)
        with self._lock:
            hit = self._bases.get(key)
        if hit is not None:
            return hit
        manifest = load_manifest(root / "versions" / version)
        base = BaseInfo(version, manifest, delta_config(manifest), BaseDocuments(manifest),
                        BaseTerms.of(manifest) if manifest.has_bm25 else None)
        with self._lock:
            self._bases[key] = base
            while len(self._bases) > 64:
                self._bases.popitem(last=False)
        return base

    def _api_hashes(self, root: Path, corpus: str | None) -> dict[str, str]:
        """doc -> content hash of the documents an earlier compaction took from the API (its corpus)."""
        if not corpus:
            return {}
        key = (str(root), corpus)
        with self._lock:
            hit = self._corpus_hashes.get(key)
        if hit is not None:
            return hit
        hashes = {r["doc_id"]: r["hash"] for r in read_corpus_records(root / corpus)}
        with self._lock:
            self._corpus_hashes[key] = hashes
            while len(self._corpus_hashes) > 64:
                self._corpus_hashes.popitem(last=False)
        return hashes

    # ---- one pass -----------------------------------------------------------------------------------
    def apply(self, root: str | Path) -> ApplyResult | None:
        """Apply what is pending in `root`'s log (None when another applier holds the root, or it takes
        no writes)."""
        root = Path(root)
        if not is_versioned_root(root) or not (writes_dir(root) / "log").is_dir():
            return None
        with locked(root, APPLY_LOCK, wait=False) as held:
            if not held:
                return None
            result = self._apply(root)
            if time.time() - self._maintained.get(str(root), 0.0) > MAINTAIN_EVERY_S:
                self.maintain(root)
            return result

    def _start_state(self, root: Path) -> WriteState:
        """The state a pass starts from: the published one, on the version CURRENT names (a version a
        batch job published since takes the base's place: the deltas and tombstones apply over it, which is
        always safe), unless a compaction is on its way to moving it."""
        state = load_write_state(root)
        current = current_version_name(root)
        if state is None:
            return WriteState(root=root, generation=WriteLog(root).floor(), base_version=current)
        if state.compacting_at is not None and not is_locked(root, COMPACT_LOCK):
            state = replace(state, compacting_at=None)  # a compaction that died: what it left is redone later
        if state.base_version != current and state.compacting_at is None:
            schema = self._base(root, current).manifest.metadata_schema or {}
            merged = merge_field_types([_schema_part(schema), _schema_part(state.metadata_schema)])
            state = replace(state, base_version=current, metadata_schema=merged or None)
        return state

    def _apply(self, root: Path) -> ApplyResult:
        t0 = time.perf_counter()
        log = WriteLog(root)
        state = self._start_state(root)
        entries = log.entries_after(state.generation, limit=self.settings.max_entries + 1)
        more = len(entries) > self.settings.max_entries
        entries = entries[: self.settings.max_entries]
        result = ApplyResult(str(root), more=more)
        if not entries:
            changed = state != load_write_state(root)
            if changed:  # a base moved by hand, or a dead compaction's mark: publish the state as read
                with locked(root, STATE_LOCK):
                    publish_state(state)
            return result
        base = self._base(root, state.base_version)
        result.first = entries[0].seq
        result.last = entries[-1].seq
        result.entries = len(entries)
        folded = Folder(state, base, lambda: self._api_hashes(root, state.corpus)).fold(entries)
        live = [rec for _, rec in folded.pending.values() if rec is not None]
        todo = delta_input(live, base.cfg)
        progress = _Progress(applying_path(root), result.first, result.last, len(todo.chunks), todo.rows)
        progress.write(0)
        rows = None
        if todo.rows:
            embedder, model_lock = self._embedder(base.cfg)
            with model_lock:
                rows = embed_input(todo, embedder, base.manifest.dim, progress.add)
        per_doc = todo.chunks_of()
        for seq, outcome in folded.outcomes.items():
            if outcome["status"] != "failed" and outcome["operation"] == "upsert":
                outcome["chunks"] = sum(per_doc.get(d, 0) for d, (s, rec) in folded.pending.items()
                                        if s == seq and rec is not None)
                outcome["indexed"] = outcome["chunks"]
        tombstones = {d: s for d, (s, _) in folded.pending.items()}
        delta, merged = None, []
        if rows is not None and rows.chunks.num_rows:
            delta, merged = self._write_delta(root, state, base, rows, tombstones, folded.schema, result)
        outcome_state = self._publish(root, state, result, folded, tombstones, delta, merged)
        if outcome_state is None:
            result.retry = True
            progress.clear()
            if delta is not None and delta.path.exists():
                shutil.rmtree(delta.path, ignore_errors=True)
            return result
        self._record(root, result, folded, outcome_state.updated_at)
        progress.clear()
        result.documents = len(live)
        result.chunks = len(todo.chunks)
        result.deleted = sum(1 for _, rec in folded.pending.values() if rec is None)
        result.failed = sum(1 for o in folded.outcomes.values() if o["status"] == "failed")
        result.seconds = round(time.perf_counter() - t0, 3)
        return result

    def _write_delta(self, root: Path, state: WriteState, base: BaseInfo, rows: DeltaRows, tombstones: dict[str, int],
                     schema: dict[str, str], result: ApplyResult) -> tuple[Delta, list[Delta]]:
        """The pass's delta, merged with the newest deltas while they are small beside it (never one a
        running compaction folds): (the new delta, the deltas it replaces)."""
        s = self.settings
        floor = state.compacting_at or 0
        kept = list(state.deltas)
        merged: list[Delta] = []
        size = rows.chunks.num_rows
        while kept and kept[-1].first_seq > floor and (kept[-1].chunks <= s.merge_factor * size
                                                       or len(kept) + 1 > s.max_deltas):
            d = kept.pop()
            merged.insert(0, d)
            size += d.chunks
        parts = []
        for d in merged:
            old = read_delta_rows(d.path, base.manifest.dim)
            after = {**state.tombstones, **tombstones}
            parts.append(old.keep(doc for doc in old.doc_ids if after.get(doc, -1) <= d.last_seq))
        parts.append(rows)
        content = DeltaRows.concat(parts, base.manifest.dim)
        first = merged[0].first_seq if merged else result.first
        out = writes_dir(root) / DELTAS / delta_name(first, result.last)
        m = write_delta(content, base.cfg, base.manifest, out, schema or None, base.terms,
                        {"first_seq": first, "last_seq": result.last, "base_version": base.version})
        result.delta = out.name
        result.merged = len(merged)
        return Delta(out, first, result.last, chunks=m.counts.chunks, vectors=m.counts.vectors,
                     created_at=min([time.time()] + [d.created_at for d in merged])), merged

    def _publish(self, root: Path, state: WriteState, result: ApplyResult, fold: Fold, tombstones: dict[str, int],
                 delta: Delta | None, merged: list[Delta]) -> WriteState | None:
        """Publish the pass's state over the one on disk now (a compaction may have reset it meanwhile);
        None when the pass must be redone (a delta it merged was folded or is being folded)."""
        with locked(root, STATE_LOCK):
            fresh = load_write_state(root)
            if fresh is None:
                fresh = replace(state, updated_at=0.0)
            elif fresh.generation != state.generation:
                raise RuntimeError(f"{root}: the write state moved from {state.generation} to {fresh.generation} "
                                   "under this applier's lock")
            names = {d.name for d in fresh.deltas}
            gone = [d for d in merged if d.name not in names]
            folding = fresh.compacting_at is not None and any(d.first_seq <= fresh.compacting_at for d in merged)
            if gone or folding:
                return None
            current = current_version_name(root)
            if fresh.compacting_at is None and current != fresh.base_version:
                fresh = replace(fresh, base_version=current)  # a version a batch job published since
            dropped = {d.name for d in merged}
            hashes = dict(fresh.hashes)
            for doc, (_, rec) in fold.pending.items():
                if rec is None:
                    hashes.pop(doc, None)
                else:
                    hashes[doc] = rec["hash"]
            now = time.time()
            new = replace(
                fresh, generation=result.last,
                deltas=tuple(d for d in fresh.deltas if d.name not in dropped) + ((delta,) if delta else ()),
                tombstones={**fresh.tombstones, **tombstones}, hashes=hashes,
                metadata_schema=merge_field_types([_schema_part(fresh.metadata_schema),
                                                   _schema_part(fold.schema)]) or None,
                retired=fresh.retired + tuple((str(d.path.relative_to(root)), now) for d in merged),
                changed_since=fresh.changed_since or (now if tombstones else None))
            return publish_state(new)

    def _record(self, root: Path, result: ApplyResult, fold: Fold, at: float) -> None:
        """The pass's outcome per entry, for GET /v1/writes/{id} (not fsynced: the STATE file says what is
        applied; a lost record reads as searchable without counts)."""
        for outcome in fold.outcomes.values():
            if outcome["status"] != "failed":
                outcome["searchable_at"] = at
        body = {"writes": {str(seq): o for seq, o in fold.outcomes.items()}}
        atomic_write_text(status_dir(root) / f"{result.first:012d}-{result.last:012d}.json", json.dumps(body))

    # ---- housekeeping -------------------------------------------------------------------------------
    def maintain(self, root: str | Path) -> None:
        """Remove retired deltas past their grace period, deltas no state names (a crashed pass's),
        crashed writers' log temporaries and statuses past their retention. Call with the apply lock held."""
        root = Path(root)
        now = time.time()
        self._maintained[str(root)] = now
        state = load_write_state(root)
        if state is None:
            return
        keep_retired = tuple(r for r in state.retired if now - r[1] < self.settings.retire_s)
        if keep_retired != state.retired:
            with locked(root, STATE_LOCK):
                fresh = load_write_state(root)
                if fresh is not None:
                    gone = {p for p, t in fresh.retired if now - t >= self.settings.retire_s}
                    publish_state(replace(fresh, retired=tuple(r for r in fresh.retired if r[0] not in gone)))
                    for rel in gone:
                        shutil.rmtree(root / rel, ignore_errors=True)
            state = load_write_state(root)
        used = {d.name for d in state.deltas} | {Path(p).name for p, _ in state.retired}
        folder = writes_dir(root) / DELTAS
        if folder.is_dir():
            for d in folder.iterdir():
                if d.name not in used:
                    shutil.rmtree(d, ignore_errors=True)
        log_dir = writes_dir(root) / "log"
        for tmp in log_dir.glob(".*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                if now - tmp.stat().st_mtime > TEMP_AGE_S:
                    tmp.unlink()
        statuses = status_dir(root)
        if statuses.is_dir():
            for f in statuses.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if now - f.stat().st_mtime > self.settings.status_retention_s:
                        f.unlink()


def _schema_part(schema: dict[str, str] | None) -> dict[str, list]:
    """A {field: type} schema as merge_field_types's per-part input."""
    return {name: [typ, "the index"] for name, typ in (schema or {}).items()}


class _Progress:
    """The applying batch's progress file (GET /v1/writes/{id} says `indexing` with the counts)."""

    def __init__(self, path: Path, first: int, last: int, chunks: int, rows: int):
        self.path, self.first, self.last, self.chunks, self.rows = path, first, last, chunks, rows
        self.done = 0
        self.written = 0.0
        self.started = time.time()

    def write(self, indexed: int) -> None:
        atomic_write_text(self.path, json.dumps({"first": self.first, "last": self.last, "chunks": self.chunks,
                                                 "indexed": indexed, "started_at": self.started}))
        self.written = time.monotonic()

    def add(self, rows: int) -> None:
        self.done += rows
        if time.monotonic() - self.written >= PROGRESS_EVERY_S:
            self.write(int(self.chunks * min(1.0, self.done / max(1, self.rows))))

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
