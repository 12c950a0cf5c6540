"""The index build's embedding stage timed as `qrag index` runs it, without Ray: `Tokenize` in worker
processes, `EmbedSink` called as Ray Data's actor calls it, the parts it writes read back, and a count of
(and an optional wait on) the checkpoint files it writes."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


# ------------------------------------------------------------------------ host tokenizer workers

_TOKENIZE = None


def worker_init(model: str) -> None:
    global _TOKENIZE
    from qrag_ray.embedding.tokens import Tokenize

    _TOKENIZE = Tokenize(model)


def tokenize_batch(chunk: tuple[np.ndarray, list[str]]) -> dict:
    rows, texts = chunk
    return _TOKENIZE({"row": rows, "embed_text": np.asarray(texts, dtype=object)})


def chunks(texts: list[str], rows: int):
    for s in range(0, len(texts), rows):
        yield np.arange(s, min(s + rows, len(texts))), texts[s:s + rows]


def sink_batch(tok: dict, shards: int) -> dict:
    """The columns the pipeline's vector rows carry, around a tokenized batch (row = chunk_idx), each
    row on its chunk's shard by the build's placement rule."""
    from qrag_ray.index.format import shard_of

    rows = tok["row"]
    n = len(rows)
    shard = shard_of(rows, shards).astype(np.int32)
    return {**tok, "chunk_idx": rows.astype(np.int64), "kind": np.full(n, "sentence", object),
            "ord": np.zeros(n, np.int64), "text": tok["embed_text"], "qn": np.full(n, -1, np.int64),
            "shard": shard, "store": np.ones(n, bool)}


class FileCount:
    """Counts the checkpoint files written (every one passes qrag_ray.index.format.atomic_write, by
    name in the modules that import it) and makes every write wait `latency_s` first (--file-latency-ms),
    the sink's progress notes too; the notes (one file per sink, rewritten) are not counted as files."""

    def __init__(self, latency_s: float):
        import qrag_ray.index.format as fmt

        self.latency_s, self.files, self.lock, real = latency_s, 0, threading.Lock(), fmt.atomic_write

        def counted(path, write, suffix=""):
            if "progress" not in Path(path).parts:
                with self.lock:
                    self.files += 1
            time.sleep(self.latency_s)
            real(path, write, suffix)

        for m in list(sys.modules.values()):
            if getattr(m, "__name__", "").startswith("qrag_ray") and getattr(m, "atomic_write", None) is real:
                m.atomic_write = counted


def time_sink(sink, batches, threads: int) -> float:
    """`threads` calls at a time, as Ray Data's actor runs them (max_concurrent_calls_per_actor)."""
    from concurrent.futures import ThreadPoolExecutor

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(sink, batches))
    return time.perf_counter() - t


def time_stage(sink, pool: ProcessPoolExecutor, texts: list[str], rows: int, threads: int, shards: int) -> float:
    """Texts in, parts out: workers tokenize batches ahead while the sink runs `threads` calls at a time."""
    from concurrent.futures import ThreadPoolExecutor

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(sink, (sink_batch(b, shards) for b in pool.map(tokenize_batch, chunks(texts, rows)))))
    return time.perf_counter() - t


def sink_vectors(work: Path, n: int) -> np.ndarray:
    """The vectors an EmbedSink wrote, by row (chunk_idx)."""
    import pyarrow.parquet as pq

    out = None
    for f in sorted((work / "vectors").rglob("*.parquet")):
        t = pq.read_table(f, columns=["chunk_idx", "vector"])
        v = np.asarray(t.column("vector").combine_chunks().flatten()).reshape(t.num_rows, -1)
        out = np.zeros((n, v.shape[1]), np.float32) if out is None else out
        out[t.column("chunk_idx").to_numpy()] = v
    return out


def time_tokenize(pool: ProcessPoolExecutor, texts: list[str], rows: int) -> float:
    t = time.perf_counter()
    for _ in pool.map(tokenize_batch, chunks(texts, rows)):
        pass
    return time.perf_counter() - t
