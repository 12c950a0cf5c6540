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
import math
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
from qrag_ray.index.write_corpus import read_corpus_records
from qrag_ray.index.write_delta import (
    BaseDocuments,
    BaseTerms,
    DeltaEmbedder,
    DeltaRows,
    delta_config,
    delta_input,
    embed_input,
    read_delta_rows,
    write_delta,
)
from qrag_ray.index.write_log import WriteLog, writes_dir
from qrag_ray.index.write_state import (
    APPLY_LOCK,
    COMPACT_LOCK,
    DELTAS,
    STATE_LOCK,
    Delta,
    WriteState,
    delta_name,
    is_locked,
    load_write_state,
    locked,
    publish_state,
)
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


class Applier:
    """Applies the pending log entries of tenant roots. Thread-safe: roots in parallel, one embedder
    per model (its forward passes one at a time) on `device` with `threads` CPU threads."""

    def __init__(self, settings: WriteSettings, threads: int = 1, device: str = "cpu"):
        self.settings = settings
        self.threads = threads
        self.device = device
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
                self._embedders[key] = (DeltaEmbedder(cfg, threads=self.threads, device=self.device),
                                         threading.Lock())
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
        started = time.perf_counter()
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
        delta = None
        if rows is not None and rows.chunks.num_rows:
            delta = self._write_delta(root, base, rows, folded.schema, result.first, result.last)
            result.delta = delta.name
        published = self._publish(root, state, result, folded, tombstones, delta)
        self._record(root, result, folded, published.updated_at)
        progress.clear()
        result.documents = len(live)
        result.chunks = len(todo.chunks)
        result.deleted = sum(1 for _, rec in folded.pending.values() if rec is None)
        result.failed = sum(1 for o in folded.outcomes.values() if o["status"] == "failed")
        result.merged = self._merge(root, base)  # after the pass is visible: a merge never delays a write
        result.seconds = round(time.perf_counter() - started, 3)
        return result

    def _write_delta(self, root: Path, base: BaseInfo, rows: DeltaRows, schema: dict[str, str], first: int,
                     last: int, created_at: float | None = None) -> Delta:
        """`rows` as the delta of sequence numbers first..last under ROOT/writes/deltas/."""
        out = writes_dir(root) / DELTAS / delta_name(first, last)
        manifest = write_delta(rows, base.cfg, base.manifest, out, schema or None, base.terms,
                               {"first_seq": first, "last_seq": last, "base_version": base.version})
        return Delta(out, first, last, chunks=manifest.counts.chunks, vectors=manifest.counts.vectors,
                     created_at=time.time() if created_at is None else created_at)

    def _merge(self, root: Path, base: BaseInfo) -> int:
        """Merge deltas while `merge_plan` finds some (from their stored vectors, no embedding), each merge
        published on its own; the deltas merged."""
        merged = 0
        while True:
            state = load_write_state(root)
            run = merge_plan(state.deltas, state.compacting_at or 0, self.settings)
            if not run:
                return merged
            parts = []
            for source in run:
                old = read_delta_rows(source.path, base.manifest.dim)
                parts.append(old.keep(doc for doc in old.doc_ids if state.visible(doc, source.last_seq)))
            content = DeltaRows.concat(parts, base.manifest.dim)
            delta = self._write_delta(root, base, content, state.metadata_schema or {}, run[0].first_seq,
                                      run[-1].last_seq, created_at=min(d.created_at for d in run))
            with locked(root, STATE_LOCK):
                fresh = load_write_state(root)
                names = [d.name for d in fresh.deltas]
                folding = fresh.compacting_at is not None and run[0].first_seq <= fresh.compacting_at
                if folding or any(d.name not in names for d in run):
                    shutil.rmtree(delta.path, ignore_errors=True)  # a compaction took them meanwhile
                    return merged
                position = names.index(run[0].name)
                deltas = fresh.deltas[:position] + (delta,) + fresh.deltas[position + len(run):]
                retired = fresh.retired + tuple((str(d.path.relative_to(root)), time.time()) for d in run)
                publish_state(replace(fresh, deltas=deltas, retired=retired))
            merged += len(run)

    def _publish(self, root: Path, state: WriteState, result: ApplyResult, fold: Fold, tombstones: dict[str, int],
                 delta: Delta | None) -> WriteState:
        """Publish the pass's state over the one on disk now (a compaction may have reset it meanwhile: the
        pass's entries and its delta are all above the generation it folds)."""
        with locked(root, STATE_LOCK):
            fresh = load_write_state(root)
            if fresh is None:
                fresh = replace(state, updated_at=0.0)
            elif fresh.generation != state.generation:
                raise RuntimeError(f"{root}: the write state moved from {state.generation} to {fresh.generation} "
                                   "under this applier's lock")
            current = current_version_name(root)
            if fresh.compacting_at is None and current != fresh.base_version:
                fresh = replace(fresh, base_version=current)  # a version a batch job published since
            hashes = dict(fresh.hashes)
            for doc, (_, rec) in fold.pending.items():
                if rec is None:
                    hashes.pop(doc, None)
                else:
                    hashes[doc] = rec["hash"]
            return publish_state(replace(
                fresh, generation=result.last, deltas=fresh.deltas + ((delta,) if delta else ()),
                tombstones={**fresh.tombstones, **tombstones}, hashes=hashes,
                metadata_schema=merge_field_types([_schema_part(fresh.metadata_schema),
                                                   _schema_part(fold.schema)]) or None,
                changed_since=fresh.changed_since or (time.time() if tombstones else None)))

    def _record(self, root: Path, result: ApplyResult, fold: Fold, searchable_at: float) -> None:
        """The pass's outcome per entry, for GET /v1/writes/{id} (not fsynced: the STATE file says what is
        applied; a lost record reads as searchable without counts)."""
        for outcome in fold.outcomes.values():
            if outcome["status"] != "failed":
                outcome["searchable_at"] = searchable_at
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
            for delta_dir in folder.iterdir():
                if delta_dir.name not in used:
                    shutil.rmtree(delta_dir, ignore_errors=True)
        log_dir = writes_dir(root) / "log"
        for tmp in log_dir.glob(".*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                if now - tmp.stat().st_mtime > TEMP_AGE_S:
                    tmp.unlink()
        statuses = status_dir(root)
        if statuses.is_dir():
            for status_file in statuses.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if now - status_file.stat().st_mtime > self.settings.status_retention_s:
                        status_file.unlink()


def merge_plan(deltas: tuple[Delta, ...], floor: int, settings: WriteSettings) -> list[Delta]:
    """The newest deltas to merge into one, or none: the newest `merge_factor` when they are of one size tier
    (their chunk counts on the same step of a logarithmic scale of base `merge_factor`), so a chunk is
    rewritten about log(n) times; or, past `max_deltas`, as many of the newest as bring the count back. Never
    a delta at or below `floor` (a running compaction folds those)."""
    trailing: list[Delta] = []
    for delta in reversed(deltas):  # the newest run above the floor
        if delta.first_seq <= floor:
            break
        trailing.insert(0, delta)
    factor = settings.merge_factor
    if len(trailing) >= factor:
        newest = trailing[-factor:]
        if len({int(math.log(max(1, d.chunks), factor)) for d in newest}) == 1:
            return newest
    over = len(deltas) - settings.max_deltas
    if over > 0 and len(trailing) >= 2:
        return trailing[-min(len(trailing), over + 1):]
    return []


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
