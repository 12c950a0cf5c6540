"""A tenant's write-ahead log (docs/SERVING.md, "Writing to a tenant"): `ROOT/writes/log/<seq:012d>.json`,
one entry per accepted batch of writes, durable before the API acknowledges it. Pure Python and `os`.

The sequence number orders every writer (several Router replicas on several nodes may append at once):
an entry is written whole to a temporary file and fsynced, then hard-linked to its numbered name, which
fails when another writer took that number first (the writer then tries the next), and the directory is
fsynced before the entry counts as written. A numbered file is therefore always complete, and numbers
are contiguous: a writer only links `n + 1` after seeing `n`. Applied entries are pruned after a
compaction: `FLOOR` is written first (the highest pruned number), then the files are removed; a writer
that raced the pruning into a freed number finds its number at or below `FLOOR`, takes its entry back
and tries again, so no entry is ever linked where the applier has already passed. Needs a filesystem
with hard links (any POSIX one, NFS included)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qrag_ray.errors import QragError

WRITES = "writes"
LOG = "log"
FLOOR = "FLOOR"
_ENTRY = re.compile(r"^(\d{12})\.json$")
_WRITE_ID = re.compile(r"^(\d{12})-([0-9a-f]{12})$")
OPERATIONS = ("upsert", "delete")
# a writer gives up after this many numbers taken by others in a row (only a runaway would need more)
MAX_CLAIMS = 10_000


def writes_dir(root: str | Path) -> Path:
    """`ROOT/writes`: the log, the deltas, the write state and the statuses of one tenant's index root."""
    return Path(root) / WRITES


def entry_name(seq: int) -> str:
    return f"{seq:012d}.json"


def write_id(seq: int, nonce: str) -> str:
    """The id a client gets for a batch: its sequence number and a random part, so ids cannot be guessed
    from one another (a tenant reads only its own root's, but numbers alone would be enumerable)."""
    return f"{seq:012d}-{nonce}"


def parse_write_id(text: str) -> tuple[int, str] | None:
    """(sequence number, nonce) of a write id, or None when `text` is not one."""
    found = _WRITE_ID.match(text or "")
    return (int(found.group(1)), found.group(2)) if found else None


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a link, a rename, an unlink) durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def durable_write(path: Path, data: bytes) -> None:
    """`data` at `path`, atomically and durably: a fsynced temporary file renamed over it, then the
    directory fsynced (a reader sees the old file or the new one, after a crash too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


@dataclass(frozen=True)
class LogEntry:
    """One accepted batch as logged. `records` (upsert): the documents in the index's input schema, each
    normalized (`doc_id`, `title`, `text`, `url`, `metadata`) with its content `hash`; `ids` or `filter`
    (delete). `error`: why a file at this number could not be read (it is skipped as a failed write)."""

    seq: int
    write_id: str
    operation: str
    submitted_at: float
    bytes: int
    records: list[dict[str, Any]] | None = None
    ids: list[str] | None = None
    filter: dict | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def documents(self) -> int | None:
        """Documents the batch names (None for a delete by filter: known once it is applied)."""
        if self.records is not None:
            return len(self.records)
        return len(self.ids) if self.ids is not None else None


def _parse(seq: int, raw: bytes) -> LogEntry:
    try:
        data = json.loads(raw)
        nonce = data["nonce"]
        operation = data["operation"]
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}")
        return LogEntry(seq=seq, write_id=write_id(seq, nonce), operation=operation,
                        submitted_at=float(data["submitted_at"]), bytes=len(raw), records=data.get("records"),
                        ids=data.get("ids"), filter=data.get("filter"), extra=data.get("extra") or {})
    except (ValueError, KeyError, TypeError) as error:
        reason = f"log entry {entry_name(seq)} is unreadable ({type(error).__name__}: {error})"
        return LogEntry(seq=seq, write_id=write_id(seq, "0" * 12), operation="unknown", submitted_at=0.0,
                        bytes=len(raw), error=reason)


class WriteLog:
    """The log under `ROOT/writes/log`. Safe to use from several threads and processes at once."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.dir = writes_dir(root) / LOG
        self._next_hint = 0

    # ---- numbers -------------------------------------------------------------------------------
    def numbers(self) -> list[int]:
        """The sequence numbers present, ascending (temporaries and other names ignored)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _ENTRY.match(n)))

    def floor(self) -> int:
        """The highest pruned sequence number (0: none pruned)."""
        try:
            return int((self.dir / FLOOR).read_text().strip() or 0)
        except FileNotFoundError:
            return 0

    def last_seq(self) -> int:
        """The highest number ever taken (pruned ones included)."""
        nums = self.numbers()  # listed before FLOOR is read: a number pruned after the listing is under FLOOR
        return max(nums[-1] if nums else 0, self.floor())

    # ---- append ----------------------------------------------------------------------------------
    def append(self, operation: str, payload: dict[str, Any], submitted_at: float | None = None) -> LogEntry:
        """Log one batch (`payload`: records, or ids or filter) under the next free number and return it;
        durable (file and directory fsynced) when this returns."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}")
        self.dir.mkdir(parents=True, exist_ok=True)
        nonce = secrets.token_hex(6)
        body = {"operation": operation, "nonce": nonce,
                "submitted_at": time.time() if submitted_at is None else submitted_at, **payload}
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        tmp = self.dir / f".{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as file:
            file.write(raw)
            file.flush()
            os.fsync(file.fileno())
        try:
            seq = self._claim(tmp)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return _parse(seq, raw)

    def _claim(self, tmp: Path) -> int:
        """Link `tmp` under the lowest free number above every number taken; return it."""
        seq = max(self._next_hint, self.last_seq() + 1)
        for _ in range(MAX_CLAIMS):
            target = self.dir / entry_name(seq)
            try:
                os.link(tmp, target)
            except FileExistsError:
                seq = max(seq + 1, self.last_seq() + 1)
                continue
            fsync_dir(self.dir)
            floor = self.floor()
            if seq <= floor:  # a number freed by pruning: the applier has passed it, so take it back
                os.unlink(target)
                fsync_dir(self.dir)
                seq = max(seq + 1, floor + 1)
                continue
            self._next_hint = seq + 1
            return seq
        raise QragError(f"{self.dir}: no free log number after {MAX_CLAIMS} tries (too many writers at once)")

    # ---- read ------------------------------------------------------------------------------------
    def read(self, seq: int) -> LogEntry | None:
        """The entry at `seq` (None when there is none, or it was pruned)."""
        try:
            raw = (self.dir / entry_name(seq)).read_bytes()
        except FileNotFoundError:
            return None
        return _parse(seq, raw)

    def entries_after(self, seq: int, limit: int | None = None) -> list[LogEntry]:
        """The entries numbered above `seq`, in order (at most `limit`); an unreadable one comes back with
        its `error` set, so the applier records it as failed instead of stopping at it."""
        out = []
        for n in self.numbers():
            if n <= seq:
                continue
            if limit is not None and len(out) >= limit:
                break
            entry = self.read(n)
            if entry is not None:
                out.append(entry)
        return out

    def pending_bytes(self, after: int) -> int:
        """Bytes of the entries numbered above `after` (the tenant's queued writes)."""
        total = 0
        for n in self.numbers():
            if n > after:
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(self.dir / entry_name(n)).st_size
        return total

    def oldest_pending(self, after: int) -> float | None:
        """The submission time (the file's mtime) of the first entry above `after`, None when none is."""
        for n in self.numbers():
            if n > after:
                with contextlib.suppress(FileNotFoundError):
                    return os.stat(self.dir / entry_name(n)).st_mtime
        return None

    # ---- prune -----------------------------------------------------------------------------------
    def prune(self, upto: int) -> int:
        """Remove the entries numbered up to `upto` (already applied and compacted): FLOOR first, so a
        writer racing into a freed number sees it; returns how many were removed."""
        if upto <= self.floor():
            return 0
        durable_write(self.dir / FLOOR, f"{upto}\n".encode())
        removed = 0
        for n in self.numbers():
            if n <= upto:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.dir / entry_name(n))
                    removed += 1
        fsync_dir(self.dir)
        return removed
