"""The question cache: a folder of Parquet files {key, raw, prompt_tokens, output_tokens}.

Raw LLM output is cached (not parsed questions) so a parser fix applies to cached outputs without
regenerating. Each generation run writes its own sub-folder as it goes, so a killed job keeps what
its finished blocks wrote; files that a crash cut short are skipped when read. Lookups are a Ray Data
join on `key`, which scales to the MS MARCO cache (tens of millions of rows) without a driver dict.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

SCHEMA = pa.schema([("key", pa.string()), ("raw", pa.string()),
                    ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64())])


def default_cache_dir() -> Path:
    root = os.environ.get("QRAG_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "qrag-ray")
    return Path(root) / "questions"


class QuestionCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else default_cache_dir()
        self.root.mkdir(parents=True, exist_ok=True)

    def files(self) -> list[str]:
        """Readable cache files; truncated ones (a killed writer) are skipped with a warning."""
        good = []
        for p in sorted(self.root.rglob("*.parquet")):
            if any(part.startswith(".") for part in p.relative_to(self.root).parts):
                continue
            try:
                md = pq.read_metadata(p)
                if md.num_rows and {"key", "raw"} <= set(md.schema.names):
                    good.append(str(p))
            except Exception as e:  # noqa: BLE001 - any unreadable file is skipped, not fatal
                log.warning("skipping unreadable question-cache file %s: %s", p, e)
        return good

    def __len__(self) -> int:
        return sum(pq.read_metadata(f).num_rows for f in self.files())

    def dataset(self):
        """All cached outputs as a Ray Dataset (None when the cache is empty)."""
        import ray.data

        files = self.files()
        if not files:
            return None
        return ray.data.read_parquet(files, columns=["key", "raw", "prompt_tokens", "output_tokens"])

    def new_run_dir(self) -> str:
        return str(self.root / f"run-{uuid.uuid4().hex[:12]}")

    def read_all(self) -> dict[str, str]:
        """key -> raw for small caches (tests, diagnostics)."""
        out: dict[str, str] = {}
        for f in self.files():
            t = pq.read_table(f, columns=["key", "raw"])
            out.update(zip(t.column("key").to_pylist(), t.column("raw").to_pylist()))
        return out
