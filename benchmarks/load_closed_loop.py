"""Closed-loop HTTP load on a running `qrag serve`: C clients, each sending its next search when the last
answered, for S seconds; prints qps, p50 and the Router's mean query-batch size (timings.embed_batch).

    qrag serve --index runs/bench_serving/index --port 8123 &
    python benchmarks/load_closed_loop.py --url http://127.0.0.1:8123 --concurrency 1,8,32 --seconds 15

A quick A/B tool for one server at a time (restart the server between variants); the side-by-side
comparison with a baseline in one run is bench_serving_compare.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving import make_queries, pct  # noqa: E402


async def _client(c, url: str, queries: list[str], stop: float, lat: list, batches: list, errors: list) -> None:
    while time.time() < stop:
        t = time.perf_counter()
        r = await c.post(f"{url}/v1/search", json={"query": random.choice(queries), "k": 10})
        lat.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200:
            errors.append(r.status_code)
            continue
        batches.append(r.json().get("timings", {}).get("embed_batch", 1))


async def run(url: str, queries: list[str], conc: int, seconds: float) -> dict:
    import httpx

    lat: list[float] = []
    batches: list[int] = []
    errors: list[int] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=conc)) as c:
        stop = time.time() + seconds
        await asyncio.gather(*[_client(c, url, queries, stop, lat, batches, errors) for _ in range(conc)])
    return {"concurrency": conc, "qps": len(batches) / seconds, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "errors": len(errors), "embed_batch_mean": statistics.mean(batches) if batches else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8123")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--out", default=None, help="also write the rows as JSON")
    a = ap.parse_args()
    queries = make_queries(a.queries)
    rows = [asyncio.run(run(a.url.rstrip("/"), queries, int(c), a.seconds)) for c in a.concurrency.split(",")]
    print(f"{'conc':>4} {'qps':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'batch':>6}")
    for r in rows:
        b = r["embed_batch_mean"]
        print(f"{r['concurrency']:>4} {r['qps']:7.1f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['errors']:>6} "
              f"{'-' if b is None else f'{b:.2f}':>6}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
