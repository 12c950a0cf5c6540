"""Embedder backends on CPU: torch vs ONNX Runtime (qrag_ray/embedding/onnx.py), same model, same texts,
same run, alternating block by block so both see the same machine load.

Two workloads: one query at a time (what the serving Router and `qrag search` do per request) and
batches of sentences and chunks (what `qrag index` does), each through the code path the product uses
(`encode` for queries, `encode_canonical` for the build). Also the largest difference between the two
backends' vectors (they must agree: indexes do not record which one built them).

    python benchmarks/bench_embed_backend.py --threads 1 --out runs/bench_embed_backend.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_workloads import corpus_texts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--threads", type=int, default=1, help="torch / ONNX Runtime intra-op threads")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--texts", type=int, default=1024, help="texts per batch block")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="runs/bench_embed_backend.json")
    a = ap.parse_args()

    import numpy as np
    import torch

    from qrag_ray.embedding import encode, encode_canonical, load_sentence_transformer
    from qrag_ray.embedding.onnx import backend_of

    torch.set_num_threads(a.threads)
    models = {b: load_sentence_transformer(a.model, device="cpu", backend=b, threads=a.threads)
              for b in ("torch", "onnx")}
    assert backend_of(models["onnx"]) == "onnx", "ONNX Runtime is not available here"
    texts, source = corpus_texts(None, a.texts)
    queries = [t[:80] for t in texts[: a.queries]]
    q_ms: dict[str, list[float]] = {b: [] for b in models}
    rate: dict[str, list[float]] = {b: [] for b in models}
    for b, st in models.items():  # warm-up
        encode(st, queries[:4])
        encode_canonical(st, texts[:64])
    for _ in range(a.rounds):
        for b, st in models.items():
            for q in queries:
                t = time.perf_counter()
                encode(st, [q])
                q_ms[b].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            encode_canonical(st, texts)
            rate[b].append(len(texts) / (time.perf_counter() - t))
    diff = float(max(np.abs(encode_canonical(models["torch"], texts[:256]) - encode_canonical(models["onnx"], texts[:256])).max(),
                     np.abs(encode(models["torch"], queries) - encode(models["onnx"], queries)).max()))
    rows = {b: {"query_p50_ms": statistics.median(q_ms[b]), "query_p90_ms": float(np.percentile(q_ms[b], 90)),
                "build_texts_per_s": statistics.median(rate[b])} for b in models}
    report = {"command": " ".join([Path(sys.executable).name] + sys.argv), "model": a.model, "threads": a.threads,
              "source": source, "texts": len(texts), "queries": len(queries), "rounds": a.rounds,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
              "backends": rows, "max_abs_diff": diff,
              "onnx_over_torch": {"query_p50_speedup": rows["torch"]["query_p50_ms"] / rows["onnx"]["query_p50_ms"],
                                  "build_rate_ratio": rows["onnx"]["build_texts_per_s"] / rows["torch"]["build_texts_per_s"]}}
    print(f"{'backend':8} {'query p50 ms':>13} {'query p90 ms':>13} {'build texts/s':>14}")
    for b, r in rows.items():
        print(f"{b:8} {r['query_p50_ms']:13.2f} {r['query_p90_ms']:13.2f} {r['build_texts_per_s']:14.1f}")
    s = report["onnx_over_torch"]
    print(f"onnx over torch: query p50 {s['query_p50_speedup']:.2f}x faster, build {s['build_rate_ratio']:.2f}x the "
          f"rate; max |diff| {diff:.1e}; threads {a.threads}; load {report['machine']['load_avg'][0]:.1f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
