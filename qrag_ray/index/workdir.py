"""The build's work dir (`<parent>/.<name>.work/`): checkpoints that let a killed `qrag index` resume
(layout: docs/SCALING.md §6): chunk and vector parts, this run's row keys, the part registry. A batch
writes one part of each kind whatever the shard count: its rows sorted by shard, one row group per
shard, so a shard's build reads only its own rows (the footers' statistics say where they are). Files
are written atomically (index/format.py), so a file that exists is complete. A resumed run drops the
rows (by `row_key`, a hash of what they are) that any earlier run embedded."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from qrag_ray.config.index import index_identity
from qrag_ray.index.format import atomic_write, atomic_write_text, key63

# the parts' layout: a work dir left in another layout is started afresh, not misread
LAYOUT = "one-part-per-batch"


def work_key(cfg_dump: dict) -> dict:
    """What the checkpoints depend on: the index identity without its documents (rows are keyed by
    content, so an append or a deletion reuses every unchanged vector), and the parts' layout."""
    return {**index_identity(cfg_dump, corpus=False), "work_layout": LAYOUT}


def run_keys_dir(work: Path, run: str) -> Path:
    return work / "runs" / run / "keys"


def run_row_keys(work: Path, run: str, shard: int | None = None) -> np.ndarray:
    """Sorted keys of every vector row this run's stream produced (embedded or reused), of one shard
    or of all."""
    files = parquet_files(run_keys_dir(work, run))
    tables = ([pq.read_table(f, columns=["row_key"]) for f in files] if shard is None
              else read_row_groups(shard_row_groups(files, shard), ["row_key"], shard))
    keys = [t.column("row_key").to_numpy() for t in tables]
    return np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)


def write_part(table: pa.Table, path: Path) -> None:
    """One batch's rows as one Parquet file whatever shards they go to: sorted by `shard` (stable), one
    row group per shard, so a reader of one shard skips the others' rows (shard_row_groups)."""
    shard = table.column("shard").to_numpy()
    order = np.argsort(shard, kind="stable")
    table = table.take(pa.array(order, pa.int64()))
    cuts = [0, *(np.flatnonzero(np.diff(shard[order])) + 1).tolist(), len(order)]

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, table.schema) as writer:
            for start, end in itertools.pairwise(cuts):
                if end > start:
                    writer.write_table(table.slice(start, end - start), row_group_size=end - start)

    atomic_write(path, write)


def shard_row_groups(files: list[Path], shard: int) -> list:
    """The row groups of these parts that hold rows of `shard`, found from the footers' statistics
    (each a fragment with its file's `path`); no rows are read."""
    if not files:
        return []
    parts = ds.dataset([str(f) for f in files], format="parquet")
    return [g for f in parts.get_fragments() for g in f.split_by_row_group(pc.field("shard") == shard)]


def read_row_groups(groups: list, columns: list[str], shard: int) -> list[pa.Table]:
    """The `shard` rows of these row groups, a table per group."""
    return [g.to_table(columns=columns, filter=pc.field("shard") == shard) for g in groups]


def input_fingerprint(files: list[str]) -> list[list]:
    """(path, size, mtime_ns) per input file: an edited corpus must not resume from stale vectors."""
    out = []
    for path in sorted(files):
        try:
            stat = os.stat(path)
            out.append([path, stat.st_size, stat.st_mtime_ns])
        except OSError:  # remote URI: the path alone
            out.append([path, None, None])
    return out


def work_dir_for(output: str | Path, explicit: str | None = None) -> Path:
    return Path(explicit) if explicit else Path(output).parent / f".{Path(output).name}.work"


def open_work_dir(work: Path, key: dict) -> bool:
    """Create or reuse `work` for `key` (True: resuming); one left for another key is wiped."""
    kpath = work / "key.json"
    if work.is_dir():
        with contextlib.suppress(OSError, ValueError):  # no or unreadable key.json: start afresh
            if json.loads(kpath.read_text()) == json.loads(json.dumps(key, default=str)):
                return True
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_text(kpath, json.dumps(key, sort_keys=True, default=str))
    return False


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def row_keys(chunk_idx, kind, ordinal, text, embed_text) -> np.ndarray:
    """63-bit identity of each vector row: its chunk, kind, position in the chunk and both texts."""
    rows = (f"{int(c)}\x1f{k}\x1f{int(o)}\x1f{t}\x1f{e}"
            for c, k, o, t, e in zip(chunk_idx, kind, ordinal, text, embed_text, strict=True))
    return np.fromiter((key63(r) for r in rows), np.int64, len(chunk_idx))


def part_name(keys: np.ndarray) -> str:
    """A part file's name from the sorted keys it holds: the same rows always give the same name."""
    return hashlib.blake2b(np.sort(np.asarray(keys, np.int64)).tobytes(), digest_size=10).hexdigest()


def parquet_files(folder: Path) -> list[Path]:
    """Complete parquet files of a folder (temporaries start with a dot), sorted by name."""
    return sorted(p for p in folder.rglob("*.parquet") if not p.name.startswith("."))


def done_row_keys(work: Path) -> np.ndarray:
    """Sorted keys of every vector row some run already embedded (read column-only)."""
    keys = [pq.read_table(f, columns=["row_key"]).column("row_key").to_numpy()
            for f in parquet_files(work / "vectors")]
    return np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)


def isin_sorted(keys: np.ndarray, sorted_ref: np.ndarray) -> np.ndarray:
    if not len(sorted_ref) or not len(keys):
        return np.zeros(len(keys), bool)
    pos = np.searchsorted(sorted_ref, keys)
    pos[pos == len(sorted_ref)] = 0
    return sorted_ref[pos] == keys


def run_registry(work: Path, run: str) -> Path:
    return work / "chunks" / "runs" / run


def registered_parts(work: Path, run: str) -> list[dict]:
    """The chunk parts this run wrote (one small JSON each: part name, shards, counts)."""
    return [json.loads(p.read_text()) for p in sorted(run_registry(work, run).glob("*.json"))]
