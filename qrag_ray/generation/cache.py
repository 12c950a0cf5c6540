"""The question cache: a folder of Parquet files {key, raw, prompt_tokens, output_tokens}.

Raw LLM output is cached (not parsed questions) so a parser fix applies to cached outputs without
regenerating. Each generation run writes its own sub-folder as it goes, so a killed job keeps what
its finished blocks wrote; files that a crash cut short are skipped when read. Lookups are a Ray Data
join on `key`, which scales to the MS MARCO cache (tens of millions of rows) without a driver dict.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

SCHEMA = pa.schema([("key", pa.string()), ("raw", pa.string()),
                    ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64())])


def default_cache_dir() -> Path:
    """QRAG_QUESTION_CACHE (the questions folder itself, e.g. on shared storage for a cluster), else
    QRAG_CACHE/questions, else ~/.cache/qrag-ray/questions. `cache_dir` in the config wins over both."""
    if shared := os.environ.get("QRAG_QUESTION_CACHE"):
        return Path(shared)
    return Path(os.environ.get("QRAG_CACHE") or Path.home() / ".cache" / "qrag-ray") / "questions"


class QuestionCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else default_cache_dir()
        self.root.mkdir(parents=True, exist_ok=True)

    def files(self) -> list[str]:
        """Readable cache files; truncated ones (a killed writer) are skipped with a warning."""
        good = []
        for path in sorted(self.root.rglob("*.parquet")):
            if any(part.startswith(".") for part in path.relative_to(self.root).parts):  # compaction temporaries
                continue
            try:
                metadata = pq.read_metadata(path)
                if metadata.num_rows and {"key", "raw"} <= set(metadata.schema.names):
                    good.append(str(path))
            except Exception as error:  # any unreadable file is skipped, not fatal
                log.warning("skipping unreadable question-cache file %s: %s", path, error)
        return good

    def __len__(self) -> int:
        return sum(pq.read_metadata(f).num_rows for f in self.files())

    def dataset(self):
        """All cached outputs as a Ray Dataset (None when the cache is empty)."""
        import ray.data

        files = self.files()
        return ray.data.read_parquet(files, columns=SCHEMA.names) if files else None

    def new_run_dir(self) -> str:
        return str(self.root / f"run-{uuid.uuid4().hex[:12]}")

    def compact(self, buckets: int = 16, keep_sources: bool = False) -> dict:
        """Merge the cache's many small run files into `buckets` files, one row per key; returns counts.

        Safe beside running builds: only files complete when compaction starts are read (each writer
        writes whole files into its own run folder), and the merged files appear by atomic rename before
        any source is removed, so a key is always in a readable file. Memory is one bucket at a time (keys
        split by their first hex digits). A build that listed the files just before a compaction removed
        them fails its read and must be re-run (it resumes): compact between builds, or keep_sources."""
        import pyarrow.compute as pc

        sources = self.files()
        if len(sources) <= 1:
            rows = len(self)
            return {"files_before": len(sources), "files_after": len(sources), "rows_before": rows, "rows_after": rows}
        cid = uuid.uuid4().hex[:10]
        tmp = self.root / f".compact-{cid}"
        rows_before = 0
        for number, source in enumerate(sources):  # pass 1: split every source by key bucket
            table = pq.read_table(source).select(SCHEMA.names).cast(SCHEMA)
            rows_before += table.num_rows
            prefixes = pc.cast(pc.utf8_slice_codeunits(table.column("key"), 0, 4), pa.string())
            ids = pa.array([int(x, 16) % buckets if x else 0 for x in prefixes.to_pylist()], pa.int32())
            for bucket in range(buckets):
                part = table.filter(pc.equal(ids, bucket))
                if part.num_rows:
                    (tmp / f"{bucket:03d}").mkdir(parents=True, exist_ok=True)
                    pq.write_table(part, tmp / f"{bucket:03d}" / f"{number:06d}.parquet")
        out = self.root / f"compact-{cid}"
        out.mkdir()
        rows_after = 0
        for bucket in range(buckets):  # pass 2: one bucket in memory, first row per key wins
            folder = tmp / f"{bucket:03d}"
            if not folder.is_dir():
                continue
            table = pa.concat_tables([pq.read_table(p) for p in sorted(folder.glob("*.parquet"))])
            first: dict[str, int] = {}
            for row, key in enumerate(table.column("key").to_pylist()):
                first.setdefault(key, row)
            table = table.take(pa.array(list(first.values()), pa.int64()))
            rows_after += table.num_rows
            part = out / f".{bucket:03d}.parquet.tmp"
            pq.write_table(table, part)
            os.replace(part, out / f"part-{bucket:03d}.parquet")
        shutil.rmtree(tmp, ignore_errors=True)
        if not keep_sources:
            for source in sources:
                Path(source).unlink(missing_ok=True)
            # emptied run folders, once idle for a while: a running build may still write into its own
            for folder in sorted(self.root.iterdir(), reverse=True):
                idle = folder.is_dir() and time.time() - folder.stat().st_mtime > 600
                if idle and folder != out and not any(folder.rglob("*")):
                    folder.rmdir()
        return {"files_before": len(sources), "files_after": len(self.files()), "rows_before": rows_before,
                "rows_after": rows_after}
