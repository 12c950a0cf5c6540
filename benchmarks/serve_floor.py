"""Serve's own floor, with nothing of qrag's search inside: what does one call from a deployment to another
cost at concurrency 1 (and, inside a replica, a worker-thread hop and the Router's shared call of one),
and what CPU per request does a big tenant's request shape cost in Serve alone, whatever our code does?

    python -m benchmarks.serve_floor [--part call,http] [--calls 300] [--requests 3000]
                                     [--concurrency 1,8,32] [--serve-env direct] [--out runs/serve_floor.json]
    python -m benchmarks.serve_floor --tiny          # smoke: 30 calls, 60 requests at c=4

Part `call`: a Caller replica times `await handle.<method>.remote(x)` (x: one 64-dim float32 query vector)
against a Callee whose methods return at once a reply shaped like a small shard reply (two 10-element
arrays and 2 KB of text): plainly, with a multiplexed model id (as tenant affinity sends it), and with the
reply made in a worker thread (as a shard search is); both with qrag's SERVE_PROCESS_ENV (the call over
gRPC, user code on the replica's own loop). Inside its own replica it also times `asyncio.to_thread` of a
no-op and the Router's shared call of one (serving/coalesce.py's Coalescer, whose call returns its input;
left out where the package has none), each against a plain `await` of an async no-op. p50/p90 per row.

Part `http`: one app per shape, each a FastAPI ingress (qrag's SERVE_PROCESS_ENV and --serve-env's
ingress) whose `POST /v1/search` validates a small JSON body into a pydantic model and answers a page of 10
results (ids, scores, 300 characters of text each) through a response model, as the Router's route does:
  - `http`: the page made at once (HTTP, Serve's request handling, FastAPI: the ingress alone);
  - `call`: one handle call per request (with a multiplexed model id) to a Back deployment whose method
    answers at once with a reply shaped like a shard group's (per query two 10-element arrays per shard
    for 4 shards and the page's texts);
  - `pass`: the requests' calls shared as the Router shares its search passes (the Coalescer: what waits
    while a call runs goes in the next one), one handle call per pass.
Closed-loop blocks of --requests at each concurrency; CPU ms per request by process over every Ray process
and of the request path (the app's replicas and the ingress). Serve's floor under a served search is the
`http` row plus, per shard call, the `call` row less the `http` row, times the calls a request makes
(serving_big.py prints the search passes per request). The `pass` row's sharing depends on how requests
arrive, so it is no stand-in for the Router's passes.
"""

# no `from __future__ import annotations`: FastAPI reads the route's annotations of the classes made in build()
import asyncio
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import options
from benchmarks.harness.report import pct, print_table, write_json

SHAPES = ("http", "call", "pass")
SHARDS = 4  # a group of four shards replies per call, as serving_big.py's one-call layout
FULL = {"calls": 300, "requests": 3000, "concurrency": [1, 8, 32]}
TINY = {"calls": 30, "requests": 60, "concurrency": [4]}


def coalescer():
    """A maker of the Router's shared call (its Coalescer, at most PASS_QUERIES a pass) where the package has
    one, else None."""
    import functools
    import importlib

    try:
        from qrag_ray.serving.coalesce import Coalescer
    except ImportError:
        return None
    for module in ("qrag_ray.serving.search_passes", "qrag_ray.serving.query_batch"):
        try:
            most = importlib.import_module(module).PASS_QUERIES
        except (ImportError, AttributeError):
            continue
        return functools.partial(Coalescer, max_items=most)
    return None


def reply() -> list:
    """A reply shaped like a small shard reply: two 10-element arrays and 2 KB of text."""
    return [np.arange(10, dtype=np.int64), np.ones(10, dtype=np.float32), {"text": "x" * 2000}]


def call_part(calls: int) -> dict:
    """Part `call`: each method's p50/p90 ms on a local Ray started here."""
    import ray
    from ray import serve

    from benchmarks.harness.trees import tree_env
    from qrag_ray.serving.config import SERVE_PROCESS_ENV

    @serve.deployment
    class Callee:
        """Answers at once, three ways."""

        async def plain(self, x):
            """The reply, at once."""
            return reply()

        @serve.multiplexed(max_num_models_per_replica=-1)
        async def _hold(self, model_id: str) -> str:
            return model_id

        async def multiplexed(self, x):
            """The reply after the multiplexed model id is looked up."""
            await self._hold(serve.get_multiplexed_model_id())
            return reply()

        async def threaded(self, x):
            """The reply made in a worker thread."""
            return await asyncio.to_thread(reply)

    @serve.deployment
    class Caller:
        """Times its calls to the Callee and its own in-replica steps."""

        def __init__(self, callee):
            self.callee = callee
            make = coalescer()
            self.passes = make(self.one_pass) if make else None

        async def one_pass(self, key, xs: list) -> list:
            """A pass that returns its input."""
            return xs

        async def awaited(self, x):
            """An async no-op."""
            return x

        async def _shared(self, x):
            return await self.passes.submit(0, x)

        async def _hop(self, x):
            return await asyncio.to_thread(lambda: x)

        async def run(self, n: int) -> dict[str, list[float]]:
            """Each step's latencies in ms, after 20 warm-up calls."""
            x = np.random.rand(1, 64).astype(np.float32)
            out = {}
            inside = {"in-replica await": self.awaited, "in-replica thread hop": self._hop}
            if self.passes is not None:
                inside["in-replica shared call of one"] = self._shared
            for name, step in inside.items():
                lat = []
                for _ in range(10 * n + 20):  # tens of microseconds each: more samples
                    start = time.perf_counter()
                    await step(x)
                    lat.append((time.perf_counter() - start) * 1000)
                out[name] = lat[20:]
            for method in ("plain", "multiplexed", "threaded"):
                handle = (self.callee.options(multiplexed_model_id="tenant/version/0") if method == "multiplexed"
                          else self.callee)
                lat = []
                for _ in range(n + 20):
                    start = time.perf_counter()
                    await getattr(handle, method).remote(x)
                    lat.append((time.perf_counter() - start) * 1000)
                out[method] = lat[20:]
            return out

    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {**tree_env(options.ROOT), **SERVE_PROCESS_ENV}})
    try:
        handle = serve.run(Caller.bind(Callee.bind()), name="serve_call", route_prefix=None)
        latencies = handle.run.remote(calls).result()
    finally:
        serve.shutdown()
        ray.shutdown()
    return {m: {"p50_ms": round(pct(v, 50), 3), "p90_ms": round(pct(v, 90), 3)} for m, v in latencies.items()}


def build(shape: str):
    """The Serve application of one shape of part `http` (its deployments defined here)."""
    from fastapi import FastAPI
    from pydantic import BaseModel
    from ray import serve

    make = coalescer()

    class Body(BaseModel):
        """The request body."""
        query: str
        k: int = 10

    class Hit(BaseModel):
        """One result."""
        chunk_id: str
        score: float
        text: str

    class Page(BaseModel):
        """The response."""
        results: list[Hit]
        took_ms: float

    def page(k: int, start: float) -> Page:
        """A page of `k` results."""
        return Page(results=[Hit(chunk_id=f"c{i}", score=1.0 - i / 100, text="x" * 300) for i in range(k)],
                    took_ms=(time.perf_counter() - start) * 1000)

    def group_reply(queries: int) -> list[dict]:
        """A shard group's reply to `queries` queries."""
        return [{"scores": np.ones((queries, 10), np.float32), "rows": np.arange(10 * queries).reshape(queries, 10),
                 "texts": {i: "y" * 300 for i in range(3 * queries)}} for _ in range(SHARDS)]

    @serve.deployment(num_replicas=1)
    class Back:
        """Answers a shard group's call at once."""

        async def search(self, qvecs):
            """The group's reply."""
            return group_reply(len(qvecs))

    app = FastAPI()

    @serve.deployment(num_replicas=1, max_ongoing_requests=256)
    @serve.ingress(app)
    class Front:
        """The FastAPI ingress of one shape."""

        def __init__(self, back=None):
            self.back = None if back is None else back.search.options(multiplexed_model_id="tenant/v1/0")
            self.passes = make(self.one_pass) if make else None

        async def one_pass(self, key, qvecs: list) -> list:
            """One handle call for the pass's queries."""
            await self.back.remote(np.stack(qvecs))
            return qvecs

        @app.post("/v1/search", response_model=Page)
        async def search(self, body: Body) -> Page:
            """The route: validate, call as the shape says, answer a page."""
            start = time.perf_counter()
            vec = np.random.rand(64).astype(np.float32)
            if shape == "call":
                await self.back.remote(vec[None, :])
            elif shape == "pass":
                await self.passes.submit("tenant/v1", vec)
            return page(body.k, start)

    return Front.bind() if shape == "http" else Front.bind(Back.bind())


def http_part(shapes: list[str], requests: int, concurrency: list[int], serve_env: str) -> list[dict]:
    """Part `http`: a row per shape and concurrency."""
    from ray import serve

    from benchmarks.harness import served
    from benchmarks.harness.load import closed_loop, summarize
    from benchmarks.harness.processes import cpu_by_process, ray_cpu_by_process, request_path_cpu

    if "pass" in shapes and coalescer() is None:
        print("shape pass left out: this package has no serving/coalesce.py Coalescer")
        shapes = [s for s in shapes if s != "pass"]
    served.ingress_env(serve_env)
    served.start_ray()
    _, port = served.start_serve()
    for shape in shapes:
        serve.run(build(shape), name=shape, route_prefix=f"/{shape}", blocking=False)
    urls = served.app_urls(shapes, serve_env, port)
    for url in urls.values():
        served.wait_ready(url)
    bodies = [{"query": f"query {i}", "k": 10} for i in range(requests)]
    rows = []
    try:
        for clients in concurrency:
            for shape, url in urls.items():
                closed_loop(url, bodies[:200], clients)  # warm: connections, the pass queue
                before = ray_cpu_by_process()
                block = closed_loop(url, bodies, clients)
                loaded = summarize(block["records"], block["wall_s"])
                by_process = cpu_by_process(before, ray_cpu_by_process(), loaded["ok"])
                rows.append({"shape": shape, "concurrency": clients, **loaded,
                             "cpu_ms_per_request": sum(by_process.values()),
                             "request_path_cpu_ms": request_path_cpu(by_process, shape),
                             "cpu_ms_per_request_by_process": by_process})
    finally:
        served.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse, run the parts, print their tables and write the report."""
    from benchmarks.harness.served import LAYOUT_HELP

    parser = options.parser(__doc__)
    options.add_common(parser, "serve_floor", concurrency=True)
    parser.add_argument("--part", default="call,http", help="call and/or http (comma list)")
    parser.add_argument("--calls", type=int, help="part call: calls per method")
    parser.add_argument("--requests", type=int, help="part http: requests per block")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="part http: shapes (comma list)")
    parser.add_argument("--serve-env", choices=("direct", "haproxy"), default="direct", help=LAYOUT_HELP)
    args = options.sized(parser.parse_args(argv), FULL, TINY)
    report = {"command": options.command(), "serve_env": args.serve_env}
    parts = args.part.split(",")
    if "call" in parts:
        report["call"] = call_part(args.calls)
        print_table([("step", "step", ""), ("p50 ms", "p50_ms", ".3f"), ("p90 ms", "p90_ms", ".3f")],
                    [{"step": step, **r} for step, r in report["call"].items()],
                    f"one deployment-to-deployment call at c=1, {args.calls} calls")
    if "http" in parts:
        shapes = [s for s in args.shapes.split(",") if s]
        report["http"] = http_part(shapes, args.requests, args.concurrency, args.serve_env)
        for row in report["http"]:
            row["by_process"] = ", ".join(f"{n.replace('ray::ServeReplica:', '')} {v:.2f}"
                                          for n, v in row["cpu_ms_per_request_by_process"].items())
        print_table([("shape", "shape", ""), ("conc", "concurrency", "d"), ("p50 ms", "p50_ms", ".1f"),
                     ("qps", "qps", ".1f"), ("errors", "errors", "d"), ("CPU ms/req", "cpu_ms_per_request", ".2f"),
                     ("path CPU", "request_path_cpu_ms", ".2f"), ("by process", "by_process", "")],
                    report["http"], f"Serve's floor, {args.requests} requests per block, {args.serve_env} ingress")
    write_json(report, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
