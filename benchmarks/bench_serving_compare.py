"""Serving throughput and latency, this tree against a baseline commit, in ONE Ray cluster, ONE run.

    python benchmarks/bench_serving_compare.py [--baseline-ref 8eac447] [--queries 60] [--concurrency 1,8,32]
                                               [--rounds 2] [--out runs/bench_serving_compare.json]

Both apps serve the same index (the `qrag demo` corpus, 3 shards, atom-sentence, built under
runs/bench_serving/) side by side: app `new` imports qrag_ray from this tree, app `base` from a git
worktree of the baseline commit (their replicas get it through the app's runtime_env PYTHONPATH), both
with their default deployment options. The machine is shared and noisy, so nothing is compared across
runs:
  - concurrency 1: in-process `SearchEngine.search` (this tree), `new` and `base` alternate query by
    query (httpx, like the other blocks), then `new` once more through http.client (a lean client:
    httpx's own CPU is ~1 ms a request on this box); p50/p99 of each;
  - concurrency 8 and 32: blocks of `--queries` requests alternate between `base` and `new`, `--rounds`
    times; qps = successful requests / wall time of that app's blocks.
  - for every block, the CPU seconds all Ray processes used: CPU ms per request, and the qps that
    implies with every core busy (what wall-clock qps shows on an idle box; on a loaded one wall-clock
    qps measures the CPU share each app won, not its cost).
Targets: new p50 <= 1.5x in-process at concurrency 1; against the default baseline (the Router before
batching), new qps >= 3x base at 8 and 32; against a later baseline, equal within the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serving import free_port, make_queries, pct  # noqa: E402
from process_cpu import ray_cpu_by_process  # noqa: E402
from serve_harness import (ENV, app_env, baseline_tree, block, check_trees, direct_ingress_urls,  # noqa: E402
                           ingress_env, start_ray, wait_ready)


def build_index_with(tree: Path, workdir: Path) -> Path:
    """The demo index as `tree`'s qrag_ray and its own bench_serving.py write it (in a subprocess): the
    baseline's format, which this tree reads too (a newer qrag reads older index formats, not the other
    way round)."""
    code = ("import sys; from pathlib import Path; from bench_serving import build_demo_index; "
            "build_demo_index(Path(sys.argv[1]))")
    subprocess.run([sys.executable, "-c", code, str(workdir)], check=True, cwd=str(workdir),
                   env={**os.environ, **ENV, "PYTHONPATH": f"{tree}:{tree / 'benchmarks'}"})
    return workdir / "index"


def deploy(index: Path, base: Path, port: int) -> None:
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    client = serve_start(http_options={"host": "127.0.0.1", "port": port})
    apps = []
    for name, tree, extra in (("base", base, {}), ("new", ROOT, {"request_timeout_s": 60})):
        apps.append({"name": name, "route_prefix": f"/{name}", "import_path": "serve_shim:build",
                     "args": {"index": str(index), **extra},
                     "runtime_env": app_env(tree)})
    client.deploy_apps(ServeDeploySchema(applications=apps))  # wait_ready() polls until both answer


def interleaved_c1(index: Path, urls: dict[str, str], queries: list[str], k: int) -> dict:
    import httpx
    import torch

    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)  # one CPU, like the replicas
    engine = SearchEngine(index, threads=1)
    clients = {n: httpx.Client(base_url=u, timeout=600) for n, u in urls.items()}
    # `new` once more through http.client on a kept-alive connection: httpx spends ~1 ms of CPU per
    # request in the client itself (same box), which is neither Serve's cost nor the engine's.
    parts = urlsplit(urls["new"])
    lean = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    lat: dict[str, list[float]] = {"in_process": [], **{n: [] for n in urls}, "new_http_client": []}
    same = dict.fromkeys(clients, 0)
    # the handler's own account of each answer (took_ms and the Router's timings): a gap between two apps
    # inside it is their code's, outside it Serve's and HTTP's
    inside: dict[str, dict[str, list[float]]] = {n: {} for n in clients}
    for q in queries[:5]:
        engine.search([q], k=k)
        for c in clients.values():
            c.post("/v1/search", json={"query": q, "k": k})
    for q in queries:
        t0 = time.perf_counter()
        want = engine.search([q], k=k)[0]
        lat["in_process"].append((time.perf_counter() - t0) * 1000)
        for n, c in clients.items():
            t0 = time.perf_counter()
            r = c.post("/v1/search", json={"query": q, "k": k})
            lat[n].append((time.perf_counter() - t0) * 1000)
            body = r.json()
            same[n] += [x["chunk_id"] for x in body["results"]] == [x["chunk_id"] for x in want]
            spent = {"took_ms": body.get("took_ms"), **(body.get("timings") or {})}
            for field, v in spent.items():
                if isinstance(v, (int, float)) and field.endswith("_ms"):
                    inside[n].setdefault(field, []).append(v)
        body = json.dumps({"query": q, "k": k})
        t0 = time.perf_counter()
        lean.request("POST", parts.path.rstrip("/") + "/v1/search", body, {"content-type": "application/json"})
        resp = lean.getresponse()
        raw = resp.read()
        lat["new_http_client"].append((time.perf_counter() - t0) * 1000)
        if resp.status != 200 or [x["chunk_id"] for x in json.loads(raw)["results"]] != [x["chunk_id"] for x in want]:
            raise RuntimeError(f"http.client answer differs from the in-process search for {q!r}: "
                               f"{resp.status} {raw[:300]!r}")
    for c in clients.values():
        c.close()
    lean.close()
    out = {n: {"p50_ms": pct(v, 50), "p99_ms": pct(v, 99), "mean_ms": statistics.mean(v)} for n, v in lat.items()}
    out.update({f"{n}_same_ranking_as_in_process": v / len(queries) for n, v in same.items()})
    out["handler_p50_ms"] = {n: {f: round(pct(v, 50), 3) for f, v in fs.items()} for n, fs in inside.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline-ref", default="8eac447")
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "bench_serving"))
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_serving_compare.json"))
    ap.add_argument("--serve-env", choices=("default", "tuned", "direct", "haproxy"), default="default",
                    help="tuned: start Ray with qrag's SERVE_PROCESS_ENV (what `qrag serve` does); direct: that and "
                         "Ray's experimental direct ingress (no HTTP proxy: each app's ingress replica listens on a "
                         "port of its own); haproxy: that behind Serve's HAProxy ingress; both apps get it")
    a = ap.parse_args()
    if a.serve_env != "default":
        ingress_env(a.serve_env)
    import ray
    from ray import serve

    base = baseline_tree(a.baseline_ref)
    a.out = str(Path(a.out).resolve())
    wd = Path(a.workdir).resolve()
    wd.mkdir(parents=True, exist_ok=True)
    os.chdir(wd)  # Ray also hands the driver's working directory to the workers' sys.path
    # logical CPUs: two apps' replicas (the new Router asks for a whole CPU) must all be scheduled at once
    start_ray()
    index = build_index_with(base, wd)
    port = free_port()
    t0 = time.time()
    deploy(index, base, port)
    if a.serve_env == "direct":
        urls = direct_ingress_urls(("base", "new"))
    else:
        urls = {n: f"http://127.0.0.1:{port}/{n}" for n in ("base", "new")}
    for u in urls.values():
        wait_ready(u)

    check_trees(base)
    queries = make_queries(a.queries)
    report: dict = {"command": " ".join([Path(sys.executable).name] + sys.argv), "baseline_ref": a.baseline_ref,
                    "serve_env": a.serve_env,
                    "index": str(index), "queries": len(queries), "k": a.k, "cpus": os.cpu_count(),
                    "deploy_s": time.time() - t0, "load_avg_start": os.getloadavg()}
    conc = [int(c) for c in a.concurrency.split(",")]
    if 1 in conc:
        report["c1"] = interleaved_c1(index, urls, queries, a.k)
    for c in (c for c in conc if c != 1):
        agg = {n: {"ok": 0, "errors": 0, "wall_s": 0.0, "lat": [], "cpu_s": 0.0, "by_proc": {}} for n in urls}
        for _ in range(a.rounds):
            for n in ("base", "new"):
                before = ray_cpu_by_process()
                ok, err, wall, lat = asyncio.run(block(urls[n], queries, a.k, c))
                after = ray_cpu_by_process()
                for name, v in after.items():
                    d = v - before.get(name, 0.0)
                    if d > 0:
                        agg[n]["by_proc"][name] = agg[n]["by_proc"].get(name, 0.0) + d
                agg[n]["cpu_s"] += sum(max(0.0, v - before.get(name, 0.0)) for name, v in after.items())
                agg[n]["ok"] += ok
                agg[n]["errors"] += err
                agg[n]["wall_s"] += wall
                agg[n]["lat"] += lat
        ncpu = os.cpu_count() or 1
        report[f"c{c}"] = {n: {"qps": v["ok"] / v["wall_s"], "ok": v["ok"], "errors": v["errors"],
                               "p50_ms": pct(v["lat"], 50), "p99_ms": pct(v["lat"], 99),
                               "cpu_ms_per_request": 1000 * v["cpu_s"] / max(1, v["ok"]),
                               "cpu_ms_per_request_by_process": {
                                   k: round(1000 * s / max(1, v["ok"]), 2)
                                   for k, s in sorted(v["by_proc"].items(), key=lambda t: -t[1]) if s > 0.05},
                               "qps_if_all_cores": ncpu * v["ok"] / max(v["cpu_s"], 1e-9)} for n, v in agg.items()}
        r = report[f"c{c}"]
        r["new_over_base_qps"] = r["new"]["qps"] / r["base"]["qps"]
        r["base_over_new_cpu_per_request"] = r["base"]["cpu_ms_per_request"] / r["new"]["cpu_ms_per_request"]
    report["load_avg_end"] = os.getloadavg()
    serve.shutdown()
    ray.shutdown()

    print(f"\nindex {index}, {len(queries)} queries, k={a.k}; baseline {a.baseline_ref}; load avg "
          f"{report['load_avg_start'][0]:.1f} -> {report['load_avg_end'][0]:.1f}")
    print(f"{'path':28s} {'conc':>4s} {'p50 ms':>8s} {'p99 ms':>8s} {'qps':>7s} {'errors':>6s} "
          f"{'CPU ms/req':>10s} {'qps@all cores':>13s}")
    if "c1" in report:
        for n in ("in_process", "base", "new", "new_http_client"):
            r = report["c1"][n]
            print(f"{n:28s} {1:>4d} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {1000 / r['mean_ms']:7.1f} {0:>6d}")
        report["new_p50_over_in_process"] = report["c1"]["new"]["p50_ms"] / report["c1"]["in_process"]["p50_ms"]
        report["new_http_client_p50_over_in_process"] = (report["c1"]["new_http_client"]["p50_ms"]
                                                         / report["c1"]["in_process"]["p50_ms"])
        report["base_p50_over_in_process"] = report["c1"]["base"]["p50_ms"] / report["c1"]["in_process"]["p50_ms"]
    for c in (c for c in conc if c != 1):
        for n in ("base", "new"):
            r = report[f"c{c}"][n]
            print(f"{n:28s} {c:>4d} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['qps']:7.1f} {r['errors']:>6d} "
                  f"{r['cpu_ms_per_request']:10.1f} {r['qps_if_all_cores']:13.1f}")
    for c in (c for c in conc if c != 1):
        for n in ("base", "new"):
            top = list(report[f"c{c}"][n]["cpu_ms_per_request_by_process"].items())[:5]
            print(f"  c={c} {n} CPU ms/request by process: " + ", ".join(f"{k} {v}" for k, v in top))
    if "c1" in report:
        print(f"c=1 p50 / in-process p50: new {report['new_p50_over_in_process']:.2f}x, base "
              f"{report['base_p50_over_in_process']:.2f}x (target new <= 1.5x); new through http.client "
              f"{report['new_http_client_p50_over_in_process']:.2f}x; same ranking as in-process: new "
              f"{report['c1']['new_same_ranking_as_in_process']:.0%}, "
              f"base {report['c1']['base_same_ranking_as_in_process']:.0%}")
        for n, fs in report["c1"]["handler_p50_ms"].items():
            print(f"c=1 {n} handler p50: " + ", ".join(f"{f} {v:.2f}" for f, v in fs.items()))
    for c in (c for c in conc if c != 1):
        print(f"c={c} qps new / base: {report[f'c{c}']['new_over_base_qps']:.2f}x wall clock, "
              f"{report[f'c{c}']['base_over_new_cpu_per_request']:.2f}x by CPU per request "
              "(target against the default baseline: >= 3x)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
