"""The index build's embedding stage timed as `qrag index` runs it, without Ray (benchmarks/embedding.py's
mode `stage`): `Tokenize` in worker processes, `EmbedSink` called as Ray Data's actor calls it, the parts
it writes read back, a count of (and an optional wait on) the checkpoint files it writes; the canonical
encode a CPU build runs and the forward-only ceiling beside them; and the texts: passages and questions of
the Python reference (it ships with Python) at the sizes asked."""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

# ------------------------------------------------------------------------------------------ texts


def corpus_texts(path: str | None, limit: int) -> tuple[list[str], str]:
    """Sentences and 200-token chunks of a real corpus: the texts atom-sentence/hybrid indexes embed."""
    from qrag_ray.text.chunking import token_windows
    from qrag_ray.text.sentences import split_sentences

    if path:
        docs = [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]
        source = path
    else:
        docs, source = _pydoc_docs()
    texts: list[str] = []
    for d in docs:
        texts += token_windows(d, 200, 20)
        texts += split_sentences(d)
    return texts[:limit], source


def _pydoc_docs() -> tuple[list[str], str]:
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    return [unwrap(topics[k]) for k in sorted(topics)], "pydoc_data.topics (Python language reference)"


def workloads(passages: int, questions: int) -> dict[str, list[str]]:
    """Passages (64-word windows, ~90 MiniLM tokens) and questions (sentences of 6-16 words) from the
    Python reference, repeated to the sizes asked (throughput depends on lengths, not on content)."""
    from qrag_ray.text.sentences import split_sentences

    docs, _ = _pydoc_docs()
    pas, qs = [], []
    for d in docs:
        w = d.split()
        pas += [" ".join(w[i:i + 64]) for i in range(0, len(w) - 63, 64)]
        qs += [s for s in split_sentences(d) if 6 <= len(s.split()) <= 16]
    return {"passages": [pas[i % len(pas)] for i in range(passages)],
            "questions": [qs[i % len(qs)] for i in range(questions)]}


# ----------------------------------------------------------------------------- measurements

TODAY_MICRO_BATCH = 64  # EmbedderConfig.batch_size, the micro-batch builds pass to encode_canonical


# ------------------------------------------------------------------------------- measurements


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA only)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_today(st, texts: list[str], device: str, tokens_per_batch: int | None = None) -> tuple[float, np.ndarray]:
    """The canonical encode a CPU build runs (tokens_per_batch None: its default budget)."""
    from qrag_ray.embedding import encode_canonical
    from qrag_ray.embedding.forward import CPU_TOKENS_PER_BATCH

    tpb = tokens_per_batch or CPU_TOKENS_PER_BATCH
    encode_canonical(st, texts[:TODAY_MICRO_BATCH], TODAY_MICRO_BATCH, tpb)
    sync(device)
    t = time.perf_counter()
    v = encode_canonical(st, texts, TODAY_MICRO_BATCH, tpb)
    return time.perf_counter() - t, v


def time_ceiling(fwd, ids: np.ndarray, lens: np.ndarray, device: str) -> float:
    """Forward passes over token batches staged on the device before the clock starts."""
    staged = [(fwd.to_device(x), fwd.to_device(n)) for _, x, n in fwd.passes(ids, lens)]
    fwd.embed(*staged[0])
    sync(device)
    t = time.perf_counter()
    for x, n in staged:
        fwd.embed(x, n)
    sync(device)
    return time.perf_counter() - t


def gpu_peak_gib(device: str) -> float | None:
    """The device's peak allocated memory in GiB since the last reset (CUDA only)."""
    import torch

    if device != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def missing(*modules: str) -> list[str]:
    """The modules of `modules` that do not import."""
    import importlib

    out = []
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception:
            out.append(m)
    return out


def reset_peak(device: str) -> None:
    """Reset the device's peak memory statistics (CUDA only)."""
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


# ------------------------------------------------------------------------ host tokenizer workers

_TOKENIZE = None


def worker_init(model: str) -> None:
    """A tokenizer process's start: the pipeline's `Tokenize` for `model`."""
    global _TOKENIZE
    from qrag_ray.embedding.tokens import Tokenize

    _TOKENIZE = Tokenize(model)


def tokenize_batch(chunk: tuple[np.ndarray, list[str]]) -> dict:
    """One batch (row numbers, texts) through the process's `Tokenize`."""
    rows, texts = chunk
    return _TOKENIZE({"row": rows, "embed_text": np.asarray(texts, dtype=object)})


def chunks(texts: list[str], rows: int):
    """(row numbers, texts) batches of `rows` texts."""
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
            """The atomic write, counted and delayed."""
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
    """Seconds for the pool to tokenize every batch of `texts`."""
    t = time.perf_counter()
    for _ in pool.map(tokenize_batch, chunks(texts, rows)):
        pass
    return time.perf_counter() - t


def run_stage(args, pool, model_path: str, model_name: str, n_pas: int, n_q: int, dtypes: list[str], tpbs: list[int],
              workers: int, cpus: int, tmp: Path) -> dict:
    """Every row of mode `stage`, each printed and written to `args.out` as it is measured."""
    import torch

    from benchmarks.harness.options import command
    from qrag_ray.embedding import Forward, load_sentence_transformer
    from qrag_ray.embedding.tokens import token_ids

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    EmbedSink = None
    if gone := missing("pyarrow", "pydantic", "yaml"):
        print(f"EmbedSink and stage rows left out: missing {', '.join(gone)} "
              f"(pip install {' '.join(gone).replace('yaml', 'pyyaml')})", flush=True)
    else:
        from qrag_ray.index.udfs import EmbedSink

        files = FileCount(args.file_latency_ms / 1000)
    threads = args.threads or max(1, cpus - workers)
    if args.device == "cpu":
        torch.set_num_threads(threads)
    texts = workloads(n_pas, n_q)
    # today's model as a build loads it (on CPU: ONNX Runtime where it runs); other dtypes on torch
    models = {dt: load_sentence_transformer(model_path, device=args.device, dtype=dt, threads=threads)
              for dt in dtypes}
    base = models.get("float32") or load_sentence_transformer(model_path, device=args.device, dtype="float32",
                                                              threads=threads)
    tok, limit = base.tokenizer, int(base.max_seq_length or 512)
    rows: list[dict] = []
    res = {"command": command(), "device": args.device,
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
           "machine": {"cpus": cpus, "platform": platform.platform(), "python": platform.python_version(),
                       "torch": torch.__version__, "load_avg_1m": round(os.getloadavg()[0], 2)},
           "model": model_name, "workers": workers, "torch_threads": threads if args.device == "cpu" else None,
           "rows_per_batch": args.rows_per_batch, "shards": args.shards, "file_latency_ms": args.file_latency_ms,
           "workloads": {}, "rows": rows}
    print(f"{model_name} on {res['gpu'] or 'CPU'}; {workers} tokenizer workers; {args.rows_per_batch} rows per batch "
          f"over {args.shards} shards; {args.file_latency_ms:g} ms per file; load avg {res['machine']['load_avg_1m']}",
          flush=True)
    print(HEAD, flush=True)

    def add(row: dict) -> None:
        """Keep, print and write a row as it is measured."""
        rows.append(row)
        print(format_row(row), flush=True)
        Path(args.out).write_text(json.dumps(res, indent=2))

    current: dict = {}  # the workload being measured: its name, today's rate, its batches

    def measured(path, dt, tpb, rate, best, fwd_rate=None, diff=None, files=None):
        """A measured rate as a row of the current workload (ratios against `best`, the forward row and today)."""
        add({"workload": current["workload"], "path": path, "dtype": dt, "tokens_per_batch": tpb,
             "texts_per_s": round(rate, 1), "ratio": round(rate / best, 3) if best else None,
             "vs_forward": round(rate / fwd_rate, 3) if fwd_rate else None,
             "x_today": round(rate / current["today"], 2), "gpu_peak_gib": gpu_peak_gib(args.device),
             "max_abs_diff": diff,
             "files_per_batch": round(files / current["batches"], 2) if files is not None else None})
        return rate

    for wl, tx in texts.items():
        if not tx:
            continue
        ids, lens = token_ids(tok, tx, limit)
        res["workloads"][wl] = w = {"texts": len(tx), "mean_tokens": round(float(lens.mean()), 1)}
        w["tokenize_texts_per_s"] = round(len(tx) / time_tokenize(pool, tx, args.rows_per_batch), 1)
        print(f"{wl}: {len(tx)} texts, {w['mean_tokens']} tokens on average; {workers} tokenizer workers alone "
              f"{w['tokenize_texts_per_s']:.0f} texts/s", flush=True)
        batches = list(pool.map(tokenize_batch, chunks(tx, args.rows_per_batch)))
        sub = tx[:args.today_limit]
        reset_peak(args.device)
        today_s, ref = time_today(base, sub, args.device)
        today = len(sub) / today_s
        add({"workload": wl, "path": "today", "dtype": "float32", "tokens_per_batch": None,
             "texts_per_s": round(today, 1), "ratio": None, "vs_forward": None, "x_today": 1.0,
             "gpu_peak_gib": gpu_peak_gib(args.device), "max_abs_diff": 0.0, "files_per_batch": None})
        if args.device == "cpu":  # the plan before: TODAY_MICRO_BATCH rows whatever their length (no token bound)
            old_s, old_v = time_today(base, sub, args.device, TODAY_MICRO_BATCH * limit)
            add({"workload": wl, "path": "rows64", "dtype": "float32", "tokens_per_batch": None,
                 "texts_per_s": round(len(sub) / old_s, 1), "ratio": None, "vs_forward": None,
                 "x_today": round(today_s / old_s, 2), "gpu_peak_gib": None,
                 "max_abs_diff": float(np.abs(old_v - ref).max()), "files_per_batch": None})

        current.update(workload=wl, today=today, batches=len(batches))
        for dt in dtypes:
            best, ceilings = 0.0, []
            for tpb in tpbs:
                reset_peak(args.device)
                rate = len(tx) / time_ceiling(Forward(models[dt], tokens_per_batch=tpb), ids, lens, args.device)
                best = max(best, rate)
                measured("ceiling", dt, tpb, rate, best)  # against the best so far; corrected below
                ceilings.append((rows[-1], rate))
            for r, rate in ceilings:  # the ceilings' own ratio, now that the sweep's best is known
                r["ratio"] = round(rate / best, 3)
            if EmbedSink is None:
                fwd = Forward(models[dt], tokens_per_batch=tpbs[0])
                fwd(ids[:8], lens[:8])
                reset_peak(args.device)
                t = time.perf_counter()
                for b in batches:
                    fwd(b["input_ids"], b["n_tokens"])
                sync(args.device)
                measured("forward", dt, tpbs[0], len(tx) / (time.perf_counter() - t), best)
                continue
            sink_rows = dict(fwd=None)
            for path in ("forward", "EmbedSink", "stage"):
                work = tmp / f"work-{wl}-{dt}-{path}"
                sink = EmbedSink(model_path, TODAY_MICRO_BATCH, None, threads if args.device == "cpu" else None,
                                 str(work), None, "bench", "auto", dt, None if args.device == "cpu" else tpbs[0])
                sink.forward(ids[:8], lens[:8])  # warm-up
                reset_peak(args.device)
                files.files = 0
                if path == "forward":  # the sink's own forward step alone, batch after batch
                    t = time.perf_counter()
                    for b in batches:
                        sink.forward(b["input_ids"], b["n_tokens"])
                    sync(args.device)
                    s = time.perf_counter() - t
                elif path == "EmbedSink":
                    sb = [sink_batch(b, args.shards) for b in batches]
                    s = time_sink(sink, sb, EmbedSink.CONCURRENCY)
                else:
                    s = time_stage(sink, pool, tx, args.rows_per_batch, EmbedSink.CONCURRENCY, args.shards)
                diff = None
                if path != "forward":
                    got = sink_vectors(work, len(tx))
                    diff = float(np.abs(got[:len(sub)] - ref).max())
                rate = measured(path, dt, None if args.device == "cpu" else tpbs[0], len(tx) / s, best,
                                sink_rows["fwd"], diff, files.files if path != "forward" else None)
                if path == "forward":
                    sink_rows["fwd"] = rate
                del sink
    return res


HEAD = "{:10} {:10} {:9} {:>9} {:>10} {:>6} {:>6} {:>8} {:>8} {:>9} {:>7}".format(
    "workload", "path", "dtype", "tok/batch", "texts/s", "ratio", "vs fwd", "x today", "GPU GiB", "max|diff|",
    "files/b")


def format_row(r: dict) -> str:
    """One row of the table as printed."""
    def f(v, fmt):
        """A cell: `-` for None."""
        return "-" if v is None else format(v, fmt)
    return "{:10} {:10} {:9} {:>9} {:>10} {:>6} {:>6} {:>8} {:>8} {:>9} {:>7}".format(
        r["workload"], r["path"], r["dtype"], f(r["tokens_per_batch"], "d"), f(r["texts_per_s"], ".0f"),
        f(r["ratio"], ".2f"), f(r["vs_forward"], ".2f"), f(r["x_today"], ".2f"), f(r["gpu_peak_gib"], ".2f"),
        f(r["max_abs_diff"], ".1e"), f(r.get("files_per_batch"), ".1f"))

