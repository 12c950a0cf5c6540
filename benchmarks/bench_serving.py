"""Serving latency: in-process embed+search+dedup vs the Ray Serve app end to end, on one index, one run.

    python benchmarks/bench_serving.py [--index DIR] [--queries 60] [--concurrency 1,8]
                                       [--llm vllm | --llm-url URL] [--hyde-queries 5] [--out runs/bench_serving.json]

Without --index it builds the `qrag demo` corpus (Python language reference, 3 shards, atom-sentence) under
runs/bench_serving/. Measures, on one index in one process:
  1. in-process `SearchEngine.search` (embed + fan-out + merge/dedup; torch and FAISS on 1 thread, like
     the replicas) and Serve over HTTP at concurrency 1, alternating query by query so both see the
     same load on a shared machine: p50/p99, the merge share of query time (engine.last and the
     response's `timings.merge_ms / took_ms`), and whether the rankings are identical;
  2. Serve at the other concurrencies (p50/p99 per request, throughput);
  3. with an LLM: mode=hyde vs the question index (mode=default) per query, through the same app.
Targets: Serve p50 <= 1.5x in-process at concurrency 1; merge/dedup <= 10% of query time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from qrag_ray.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


SAME_LOOP_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[i]


def make_queries(n: int) -> list[str]:
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import DEMO_QUERIES

    qs = list(DEMO_QUERIES)
    for name in sorted(topics):
        qs.append(f"How does {name.replace('-', ' ')} work in Python?")
    return (qs * (n // len(qs) + 1))[:n]


def build_demo_index(workdir: Path) -> Path:
    from qrag_ray.config.index import build_index_config
    from qrag_ray.io.pydoc_corpus import write_pydoc_corpus
    from qrag_ray.index.build import build_index

    out = workdir / "index"
    if (out / "manifest.json").is_file():
        return out
    write_pydoc_corpus(workdir / "corpus.jsonl")
    cfg = build_index_config(None, input=str(workdir / "corpus.jsonl"), format="jsonl",
                             representation="atom-sentence", shards=3, build={"output": str(out), "overwrite": True},
                             generator={"backend": "none"}, chunker={"method": "token", "size": 200, "overlap": 20})
    build_index(cfg)
    return out


def bench_interleaved(index: Path, url: str, queries: list[str], k: int, rounds: int = 2) -> tuple[dict, dict]:
    """In-process and Serve (concurrency 1) alternate query by query, so both see the same machine load
    (this box is shared: a baseline taken a minute apart from the Serve run is not comparable)."""
    import httpx
    import torch

    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)  # what the QueryEmbedder replica (num_cpus=1) uses
    engine = SearchEngine(index, threads=1)
    client = httpx.Client(base_url=url, timeout=600)
    for q in queries[:5]:
        engine.search([q], k=k)
        client.post("/v1/search", json={"query": q, "k": k})
    ip_lat, ip_share, ip_merge, sv_lat, sv_share, same = [], [], [], [], [], 0
    parts: dict[str, list[float]] = {}
    for _ in range(rounds):
        for q in queries:
            t0 = time.perf_counter()
            want = engine.search([q], k=k)[0]
            ms = (time.perf_counter() - t0) * 1000
            ip_lat.append(ms)
            ip_merge.append(engine.last.merge_ms)
            ip_share.append(engine.last.merge_ms / ms)
            t0 = time.perf_counter()
            r = client.post("/v1/search", json={"query": q, "k": k})
            sv_lat.append((time.perf_counter() - t0) * 1000)
            body = r.json()
            sv_share.append(body["timings"]["merge_ms"] / body["took_ms"])
            for key in ("embed_ms", "search_ms", "merge_ms"):
                parts.setdefault(key, []).append(body["timings"][key])
            parts.setdefault("router_took_ms", []).append(body["took_ms"])
            same += [x["chunk_id"] for x in body["results"]] == [x["chunk_id"] for x in want]
    client.close()
    ip = {"p50_ms": pct(ip_lat, 50), "p99_ms": pct(ip_lat, 99), "mean_ms": statistics.mean(ip_lat),
          "merge_p50_ms": pct(ip_merge, 50), "merge_share_mean": statistics.mean(ip_share)}
    sv = {"concurrency": 1, "mode": "default", "n": len(sv_lat), "errors": 0, "p50_ms": pct(sv_lat, 50),
          "p99_ms": pct(sv_lat, 99), "mean_ms": statistics.mean(sv_lat), "qps": 1000 / statistics.mean(sv_lat),
          "merge_share_mean": statistics.mean(sv_share), "same_ranking_as_in_process": same / len(sv_lat),
          "router_breakdown_p50_ms": {key: pct(v, 50) for key, v in parts.items()}}
    return ip, sv


async def bench_serve(url: str, queries: list[str], k: int, concurrency: int, mode: str = "default") -> dict:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    lat, shares, errors = [], [], 0

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one(q: str):
            nonlocal errors
            async with sem:
                t0 = time.perf_counter()
                r = await client.post("/v1/search", json={"query": q, "k": k, "mode": mode})
                ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                errors += 1
                return
            body = r.json()
            lat.append(ms)
            shares.append(body["timings"]["merge_ms"] / max(body["took_ms"], 1e-9))

        t0 = time.perf_counter()
        await asyncio.gather(*[one(q) for q in queries])
        wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "mode": mode, "n": len(lat), "errors": errors, "p50_ms": pct(lat, 50),
            "p99_ms": pct(lat, 99), "mean_ms": statistics.mean(lat) if lat else float("nan"),
            "qps": len(lat) / wall, "merge_share_mean": statistics.mean(shares) if shares else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--index", help="index directory (default: build the demo corpus index)")
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "bench_serving"))
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--llm", choices=["vllm"], help="HyDE through the bundled Qwen on vLLM (CPU: slow start)")
    ap.add_argument("--llm-url", help="HyDE through an OpenAI-compatible endpoint")
    ap.add_argument("--llm-model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--hyde-queries", type=int, default=5)
    ap.add_argument("--serve-same-loop", action="store_true",
                    help="RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0, RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0 "
                         "(one event loop per replica: fewer thread hops per request)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_serving.json"))
    a = ap.parse_args()

    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
    import ray
    from ray import serve

    from qrag_ray.cli.serve_cmd import wait_healthy
    from qrag_ray.serving.application import build_app

    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if a.serve_same_loop:
        env.update(SAME_LOOP_ENV)
    ray.init(address="local", num_cpus=8, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": env})
    wd = Path(a.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    index = Path(a.index) if a.index else build_demo_index(wd)
    queries = make_queries(a.queries)
    report: dict = {"command": " ".join([Path(sys.executable).name] + sys.argv), "index": str(index),
                    "serve_env": {k: v for k, v in env.items() if k.startswith("RAY_SERVE")},
                    "queries": len(queries), "k": a.k, "cpus": os.cpu_count()}
    from qrag_ray.index.format import load_manifest

    man = load_manifest(index)
    report["index_counts"] = man.data.get("counts")
    report["num_shards"] = man.num_shards

    args: dict = {"index": str(index)}
    if a.llm or a.llm_url:
        args["generator"] = ({"backend": "openai", "base_url": a.llm_url, "model": a.llm_model} if a.llm_url
                             else {"backend": "vllm", "model": a.llm_model, "concurrency": 1})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    serve.run(build_app(args), name="qrag", route_prefix="/")
    wait_healthy(url)
    report["serve_startup_s"] = time.perf_counter() - t0
    report["in_process"], serve1 = bench_interleaved(index, url, queries, a.k)
    report["serve"] = [serve1] + [asyncio.run(bench_serve(url, queries * 2, a.k, int(c)))
                                  for c in a.concurrency.split(",") if int(c) != 1]
    if "generator" in args:
        hq = queries[: a.hyde_queries]
        asyncio.run(bench_serve(url, hq[:1], a.k, 1, "hyde"))  # warm-up (vLLM compiles on first use)
        report["hyde"] = asyncio.run(bench_serve(url, hq, a.k, 1, "hyde"))
        report["question_index"] = asyncio.run(bench_serve(url, hq, a.k, 1, "default"))
    serve.shutdown()
    ray.shutdown()

    ip = report["in_process"]
    s1 = next((s for s in report["serve"] if s["concurrency"] == 1), report["serve"][0])
    report["serve_p50_over_in_process_p50"] = s1["p50_ms"] / ip["p50_ms"]
    rows = [("in-process embed+search+dedup", "1", ip["p50_ms"], ip["p99_ms"], "", ip["merge_share_mean"])]
    rows += [("Serve end-to-end (HTTP)", str(s["concurrency"]), s["p50_ms"], s["p99_ms"], f"{s['qps']:.1f}",
              s["merge_share_mean"]) for s in report["serve"]]
    if "hyde" in report:
        for key, label in (("question_index", "Serve question index (mode=default)"), ("hyde", "Serve HyDE (mode=hyde)")):
            s = report[key]
            rows.append((label, "1", s["p50_ms"], s["p99_ms"], f"{s['qps']:.2f}", s["merge_share_mean"]))
        report["hyde_over_question_index_p50"] = report["hyde"]["p50_ms"] / report["question_index"]["p50_ms"]
    print(f"\nindex {index} ({report['num_shards']} shards, {report['index_counts']}), {len(queries)} queries, k={a.k}")
    print(f"{'path':40s} {'conc':>4s} {'p50 ms':>9s} {'p99 ms':>9s} {'qps':>7s} {'merge share':>11s}")
    for name, c, p50, p99, qps, share in rows:
        print(f"{name:40s} {c:>4s} {p50:9.1f} {p99:9.1f} {qps:>7s} {share:10.1%}")
    print(f"Serve (c=1) router breakdown p50 ms: {s1['router_breakdown_p50_ms']}; "
          f"same ranking as in-process: {s1['same_ranking_as_in_process']:.0%}")
    print(f"Serve p50 / in-process p50 (concurrency 1): {report['serve_p50_over_in_process_p50']:.2f}x (target <= 1.5x)")
    if "hyde_over_question_index_p50" in report:
        print(f"HyDE p50 / question-index p50: {report['hyde_over_question_index_p50']:.1f}x")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
