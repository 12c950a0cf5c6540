"""What a tenant's writes have made searchable so far: `ROOT/writes/STATE`, published atomically (temp +
fsync + rename) by the applier after each batch it applies and by a compaction when it resets the deltas
onto a new index version. This module is the interface the search side reads.

    WriteState
      generation     the last applied log sequence number (0: none yet)
      base_version   the version under ROOT/versions/ the deltas apply over
      base_seq       the sequence number that version was compacted at (0: never compacted)
      deltas         (Delta(path, first_seq, last_seq, ...), ...): small indexes in the standard format
                     (one shard, Flat FAISS, BM25 when the base has it), oldest first, disjoint ranges
      tombstones     doc_id -> sequence number of the latest write that touched it (upsert or delete)
      metadata_schema  {field: type} of the base and the deltas together (what a filter may name)

Visibility rule: a chunk of document D in a segment whose newest sequence number is G (a delta's
`last_seq`; the base's `base_seq`) is visible iff `tombstones.get(D, -1) <= G`. A write of D after the
segment was made hides D there; the segment holding D's latest write shows it; so every document is
visible in at most one segment, and a deleted one in none. `WriteState.hidden(segment_seq)` gives the
documents a segment must exclude (the search's pre-filter); `WriteState.segments()` lists them all.

`read_write_state(root)` re-reads the file only when its identity (inode, size, mtime) changed, so a
Router may call it per request. The file locks (`locked`) use fcntl.flock, which works across processes on
one machine and across NFS clients (the Linux NFS client maps it to byte-range locks)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from qrag_ray.errors import IndexFormatError
from qrag_ray.index.write_log import durable_write, writes_dir

STATE = "STATE"
DELTAS = "deltas"
STATE_LOCK = ".state.lock"  # held while STATE is read, changed and written back
APPLY_LOCK = ".apply.lock"  # held by the one applier of a root
COMPACT_LOCK = ".compact.lock"  # held by the one compaction of a root
FORMAT = 1


@dataclass(frozen=True)
class Delta:
    """One delta index: the live documents of the log entries first_seq..last_seq (and of the deltas it
    merged), built through the tenant's own representation."""

    path: Path  # the delta's index directory (absolute)
    first_seq: int
    last_seq: int
    chunks: int = 0
    vectors: int = 0
    created_at: float = 0.0

    @property
    def name(self) -> str:
        return self.path.name


def delta_name(first_seq: int, last_seq: int) -> str:
    """A delta's directory name under ROOT/writes/deltas/: its range of sequence numbers."""
    return f"{first_seq:012d}-{last_seq:012d}"


@dataclass(frozen=True)
class Segment:
    """One index a search of the tenant covers: the base version or a delta (a directory in the standard
    format), its newest sequence number, and the documents it must leave out (its pre-filter)."""

    path: Path
    seq: int
    hidden: frozenset[str]


@dataclass(frozen=True)
class WriteState:
    """A tenant's write state as published (see the module docstring for the visibility rule)."""

    root: Path
    generation: int
    base_version: str
    base_seq: int = 0
    deltas: tuple[Delta, ...] = ()
    tombstones: Mapping[str, int] = field(default_factory=dict)
    metadata_schema: dict[str, str] | None = None
    # doc_id -> content hash of the live documents written since the base (a repeated write is a no-op)
    hashes: Mapping[str, str] = field(default_factory=dict)
    # the generation a running compaction folds (deltas at or below it are not merged meanwhile)
    compacting_at: int | None = None
    # the writes corpus and deleted-ids file of the last compaction (ROOT-relative; index/compaction.py)
    corpus: str | None = None
    deleted_ids: str | None = None
    # delta directories no longer in use, with the time they left it: removed after a grace period
    retired: tuple[tuple[str, float], ...] = ()
    # when the first write since the base was applied (None: nothing to compact): a compaction's age
    changed_since: float | None = None
    updated_at: float = 0.0

    @property
    def base_dir(self) -> Path:
        return self.root / "versions" / self.base_version

    def visible(self, doc_id: str, segment_seq: int) -> bool:
        """Whether a chunk of `doc_id` in a segment whose newest sequence number is `segment_seq` counts."""
        return self.tombstones.get(doc_id, -1) <= segment_seq

    def hidden(self, segment_seq: int) -> frozenset[str]:
        """The documents a segment whose newest sequence number is `segment_seq` must leave out."""
        return frozenset(d for d, s in self.tombstones.items() if s > segment_seq)

    @property
    def hidden_in_base(self) -> frozenset[str]:
        return self.hidden(self.base_seq)

    def segments(self) -> list[Segment]:
        """What a search of the tenant covers, base first then the deltas oldest first, each with the
        documents it must exclude: merged with one fusion and dedup, they give each document once."""
        return [Segment(self.base_dir, self.base_seq, self.hidden(self.base_seq))] + [
            Segment(d.path, d.last_seq, self.hidden(d.last_seq)) for d in self.deltas]

    @property
    def version_key(self) -> tuple[str, int]:
        """(base version, generation): changes with every applied pass and every compaction."""
        return self.base_version, self.generation

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "generation": self.generation, "base_version": self.base_version,
                "base_seq": self.base_seq,
                "deltas": [{"path": str(d.path.relative_to(self.root)), "first_seq": d.first_seq,
                            "last_seq": d.last_seq, "chunks": d.chunks, "vectors": d.vectors,
                            "created_at": d.created_at} for d in self.deltas],
                "tombstones": dict(sorted(self.tombstones.items())), "metadata_schema": self.metadata_schema,
                "hashes": dict(sorted(self.hashes.items())), "compacting_at": self.compacting_at,
                "corpus": self.corpus, "deleted_ids": self.deleted_ids,
                "retired": [list(r) for r in self.retired], "changed_since": self.changed_since,
                "updated_at": self.updated_at}


def state_from_json(root: Path, data: dict[str, Any]) -> WriteState:
    """A WriteState from the STATE file's JSON (IndexFormatError when it is not one)."""
    try:
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown format {data.get('format')!r}")
        deltas = tuple(Delta(path=root / d["path"], first_seq=int(d["first_seq"]), last_seq=int(d["last_seq"]),
                             chunks=int(d.get("chunks", 0)), vectors=int(d.get("vectors", 0)),
                             created_at=float(d.get("created_at", 0.0))) for d in data.get("deltas") or [])
        return WriteState(root=root, generation=int(data["generation"]), base_version=str(data["base_version"]),
                          base_seq=int(data.get("base_seq", 0)), deltas=deltas,
                          tombstones={str(k): int(v) for k, v in (data.get("tombstones") or {}).items()},
                          metadata_schema=data.get("metadata_schema") or None,
                          hashes={str(k): str(v) for k, v in (data.get("hashes") or {}).items()},
                          compacting_at=data.get("compacting_at"), corpus=data.get("corpus"),
                          deleted_ids=data.get("deleted_ids"),
                          retired=tuple((str(p), float(t)) for p, t in data.get("retired") or []),
                          changed_since=data.get("changed_since"), updated_at=float(data.get("updated_at", 0.0)))
    except (KeyError, TypeError, ValueError) as error:
        raise IndexFormatError(f"corrupt write state {writes_dir(root) / STATE}: {error}") from None


def state_path(root: str | Path) -> Path:
    return writes_dir(root) / STATE


def load_write_state(root: str | Path) -> WriteState | None:
    """The STATE file of `root` read now (None: no write was ever applied there)."""
    path = state_path(root)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise IndexFormatError(f"corrupt write state {path}: {error}") from None
    return state_from_json(Path(root), data)


_cache_lock = threading.Lock()
_cache: dict[str, tuple[tuple[int, ...], WriteState]] = {}


def read_write_state(root: str | Path) -> WriteState | None:
    """`load_write_state`, parsed once per state of the file (a stat per call otherwise)."""
    path = state_path(root)
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    ident = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    key = str(path)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] == ident:
        return hit[1]
    state = load_write_state(root)
    if state is not None:
        with _cache_lock:
            _cache[key] = (ident, state)
    return state


def publish_state(state: WriteState) -> WriteState:
    """Write `state` as ROOT/writes/STATE, atomically and durably (stamped with the time)."""
    state = replace(state, updated_at=time.time())
    durable_write(state_path(state.root), json.dumps(state.to_json(), ensure_ascii=False, indent=1).encode())
    return state


@contextlib.contextmanager
def locked(root: str | Path, name: str, wait: bool = True) -> Iterator[bool]:
    """An exclusive lock on ROOT/writes/<name> for the block: yields True when held, False when `wait` is
    False and another process holds it. The kernel releases it when the holder dies (kill -9 included)."""
    path = writes_dir(root) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def is_locked(root: str | Path, name: str) -> bool:
    """Whether some process holds ROOT/writes/<name> right now."""
    with locked(root, name, wait=False) as held:
        return not held
