"""Serve's own cost of one call from a deployment to another at concurrency 1: the floor under the
Router's call to a ShardSearcher (what a big tenant's query pays beyond the shards' searches); and,
inside one replica, what a lone request pays for the Router's shared call (serving/coalesce.py, a call
of its own) and for one worker-thread hop (`asyncio.to_thread`): what a small tenant's lone request pays
beyond the search.

    python benchmarks/bench_serve_call.py [--calls 300] [--out runs/bench_serve_call.json]

A Caller replica times `await handle.<method>.remote(x)` (x: one 64-dim float32 query vector) against a
Callee whose methods return at once a reply shaped like a small shard reply (two 10-element arrays and
2 KB of text): plainly, with a multiplexed model id (as tenant affinity sends it), and with the reply
made in a worker thread (as a shard search is). Both replicas run with qrag's SERVE_PROCESS_ENV (the
call over gRPC, user code on the replica's own loop), on a local Ray started in-process. The Caller
also times, in its own replica, `await self.passes.submit(key, x)` (a Coalescer as the Router's search
passes use it, whose call returns its input) and `await asyncio.to_thread(...)` of a no-op, each against a plain
`await` of an async no-op.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serving import pct  # noqa: E402


def reply() -> list:
    return [np.arange(10, dtype=np.int64), np.ones(10, dtype=np.float32), {"text": "x" * 2000}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_serve_call.json"))
    a = ap.parse_args()
    import ray
    from ray import serve

    from qrag_ray.serving.config import SERVE_PROCESS_ENV

    @serve.deployment
    class Callee:
        async def plain(self, x):
            return reply()

        @serve.multiplexed(max_num_models_per_replica=-1)
        async def _hold(self, model_id: str) -> str:
            return model_id

        async def multiplexed(self, x):
            await self._hold(serve.get_multiplexed_model_id())
            return reply()

        async def threaded(self, x):
            return await asyncio.to_thread(reply)

    @serve.deployment
    class Caller:
        def __init__(self, callee):
            from qrag_ray.serving.coalesce import Coalescer
            from qrag_ray.serving.query_batch import PASS_QUERIES

            self.callee = callee
            self.passes = Coalescer(self.one_pass, PASS_QUERIES)

        async def one_pass(self, key, xs: list) -> list:
            return xs

        async def awaited(self, x):
            return x

        async def run(self, n: int) -> dict[str, list[float]]:
            """Each method's call latencies in ms, after 20 warm-up calls."""
            x = np.random.rand(1, 64).astype(np.float32)
            out = {}
            inside = {"in-replica await": self.awaited, "in-replica shared call of one": lambda v: self.passes.submit(0, v),
                      "in-replica thread hop": lambda v: asyncio.to_thread(lambda: v)}
            for name, step in inside.items():
                lat = []
                for _ in range(10 * n + 20):  # tens of microseconds each: more samples
                    t0 = time.perf_counter()
                    await step(x)
                    lat.append((time.perf_counter() - t0) * 1000)
                out[name] = lat[20:]
            for method in ("plain", "multiplexed", "threaded"):
                h = self.callee.options(multiplexed_model_id="tenant/version/0") if method == "multiplexed" else self.callee
                lat = []
                for _ in range(n + 20):
                    t0 = time.perf_counter()
                    await getattr(h, method).remote(x)
                    lat.append((time.perf_counter() - t0) * 1000)
                out[method] = lat[20:]
            return out

    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": dict(SERVE_PROCESS_ENV)})
    try:
        handle = serve.run(Caller.bind(Callee.bind()), name="serve_call", route_prefix=None)
        latencies = handle.run.remote(a.calls).result()
    finally:
        serve.shutdown()
        ray.shutdown()
    result = {m: {"p50_ms": round(pct(v, 50), 3), "p90_ms": round(pct(v, 90), 3)} for m, v in latencies.items()}
    print(f"one deployment-to-deployment call at c=1, {a.calls} calls")
    print(f"{'method':24s} {'p50 ms':>8s} {'p90 ms':>8s}")
    for method, r in result.items():
        print(f"{method:24s} {r['p50_ms']:8.3f} {r['p90_ms']:8.3f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"calls": a.calls, "serve_env": SERVE_PROCESS_ENV, **result}, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
