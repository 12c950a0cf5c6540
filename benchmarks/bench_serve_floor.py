"""Serve's own CPU per request for the shape of a big tenant's query, with nothing of qrag's inside: what
the fan-out costs on top of the search whatever our code does (the floor under bench_big_tenant.py's
served / in-process ratio).

    python benchmarks/bench_serve_floor.py [--requests 3000] [--concurrency 1,8,32] [--serve-env direct]

One app per shape, each a FastAPI ingress (qrag's SERVE_PROCESS_ENV; direct ingress by default, the
ingress replica serving HTTP itself) whose `POST /v1/search` validates a small JSON body into a pydantic
model and answers a page of 10 results (ids, scores, 300 characters of text each) through a response
model, as the Router's route does:
  - `http`: the page made at once (HTTP, Serve's request handling, FastAPI: the ingress alone);
  - `call`: one handle call per request (with a multiplexed model id, as tenant affinity sends it) to a
    Back deployment whose method answers at once with a reply shaped like a shard group's (per query two
    10-element arrays per shard and the page's texts);
  - `pass`: the requests' calls shared as the Router shares its search passes (serving/coalesce.py: what
    waits while a call runs goes in the next one, 32 waiting start another), one handle call per pass.
Blocks of --requests at each concurrency (an httpx client in this process, as bench_big_tenant.py's);
CPU ms per request by process, over every Ray process, and of the request path (the app's replicas:
`process_cpu.py`). Serve's floor under a served search is the `http` row plus, per shard call, the `call`
row less the `http` row, times the calls a request makes (bench_big_tenant.py prints the search passes
per request): how much of what the served path adds to the in-process search is Serve's own. The `pass`
row's sharing depends on how requests arrive, so it is no stand-in for the Router's passes.
"""

# no `from __future__ import annotations`: FastAPI reads the route's annotations, classes made in build()
import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serving import free_port, pct  # noqa: E402
from process_cpu import cpu_by_process, ray_cpu_by_process, request_path_cpu  # noqa: E402
from serve_harness import block, direct_ingress_urls, ingress_env, start_ray, wait_ready  # noqa: E402

SHAPES = ("http", "call", "pass")
SHARDS = 4  # a group of four shards replies per call, as bench_big_tenant.py's layout


def build(shape: str):
    """The Serve application of one shape (its deployments defined here, so only this script's imports)."""
    import numpy as np
    from fastapi import FastAPI
    from pydantic import BaseModel
    from ray import serve

    from qrag_ray.serving.coalesce import Coalescer
    from qrag_ray.serving.query_batch import PASS_QUERIES

    class Body(BaseModel):
        query: str
        k: int = 10

    class Hit(BaseModel):
        chunk_id: str
        score: float
        text: str

    class Page(BaseModel):
        results: list[Hit]
        took_ms: float

    def page(k: int, t0: float) -> Page:
        return Page(results=[Hit(chunk_id=f"c{i}", score=1.0 - i / 100, text="x" * 300) for i in range(k)],
                    took_ms=(time.perf_counter() - t0) * 1000)

    def group_reply(queries: int) -> list[dict]:
        return [{"scores": np.ones((queries, 10), np.float32), "rows": np.arange(10 * queries).reshape(queries, 10),
                 "texts": {i: "y" * 300 for i in range(3 * queries)}} for _ in range(SHARDS)]

    @serve.deployment(num_replicas=1)
    class Back:
        async def search(self, qvecs):
            return group_reply(len(qvecs))

    app = FastAPI()

    @serve.deployment(num_replicas=1, max_ongoing_requests=256)
    @serve.ingress(app)
    class Front:
        def __init__(self, back=None):
            self.back = None if back is None else back.search.options(multiplexed_model_id="tenant/v1/0")
            self.passes = Coalescer(self.one_pass, PASS_QUERIES)

        async def one_pass(self, key, qvecs: list) -> list:
            await self.back.remote(np.stack(qvecs))
            return qvecs

        @app.post("/v1/search", response_model=Page)
        async def search(self, body: Body) -> Page:
            t0 = time.perf_counter()
            vec = np.random.rand(64).astype(np.float32)
            if shape == "call":
                await self.back.remote(vec[None, :])
            elif shape == "pass":
                await self.passes.submit("tenant/v1", vec)
            return page(body.k, t0)

    return Front.bind() if shape == "http" else Front.bind(Back.bind())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--serve-env", choices=("direct", "haproxy"), default="direct")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_serve_floor.json"))
    a = ap.parse_args()
    ingress_env(a.serve_env)
    import ray
    from ray import serve
    from ray.serve._private.api import serve_start

    shapes = [s for s in a.shapes.split(",") if s]
    start_ray()
    port = free_port()
    serve_start(http_options={"host": "127.0.0.1", "port": port})
    for s in shapes:
        serve.run(build(s), name=s, route_prefix=f"/{s}", blocking=False)
    urls = direct_ingress_urls(tuple(shapes)) if a.serve_env == "direct" else {
        s: f"http://127.0.0.1:{port}/{s}" for s in shapes}
    for u in urls.values():
        wait_ready(u)
    queries = [f"query {i}" for i in range(a.requests)]
    rows = []
    try:
        for c in [int(x) for x in a.concurrency.split(",")]:
            for s, url in urls.items():
                asyncio.run(block(url, queries[:200], 10, c))  # warm: connections, the batch queue
                before = ray_cpu_by_process()
                ok, errors, wall, lat = asyncio.run(block(url, queries, 10, c))
                by = cpu_by_process(before, ray_cpu_by_process(), ok)
                rows.append({"shape": s, "concurrency": c, "ok": ok, "errors": errors, "qps": ok / wall,
                             "p50_ms": pct(lat, 50), "cpu_ms_per_request": sum(by.values()),
                             "request_path_cpu_ms": request_path_cpu(by, s),
                             "cpu_ms_per_request_by_process": by})
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"Serve's floor, {a.requests} requests per block, {a.serve_env} ingress")
    print(f"{'shape':8s} {'conc':>4s} {'p50 ms':>7s} {'qps':>7s} {'errors':>6s} {'CPU ms/req':>10s} {'path CPU':>8s}  by process")
    for r in rows:
        by = ", ".join(f"{n.replace('ray::ServeReplica:', '')} {v:.2f}" for n, v in r["cpu_ms_per_request_by_process"].items()
                       if v >= 0.05)
        print(f"{r['shape']:8s} {r['concurrency']:4d} {r['p50_ms']:7.1f} {r['qps']:7.1f} {r['errors']:6d} "
              f"{r['cpu_ms_per_request']:10.2f} {r['request_path_cpu_ms']:8.2f}  {by}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "serve_env": a.serve_env, "rows": rows}, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
