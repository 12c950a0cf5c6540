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
import atexit
import asyncio
import http.client
import json
import os
import statistics
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serving import free_port, make_queries, pct  # noqa: E402

# Ray hands the driver's sys.path to every worker ahead of the app's PYTHONPATH, so this tree must not
# be on it: the baseline app would import this tree's qrag_ray instead of the baseline's. This process
# imports this tree's qrag_ray first (run with PYTHONPATH=this tree), so its later imports of the
# package's modules come from the package's own path. check_trees() checks both apps.
import qrag_ray  # noqa: E402,F401

sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != ROOT]

ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def baseline_tree(ref: str) -> Path:
    """A detached git worktree of `ref` under runs/ (made once, reused)."""
    tree = ROOT / "runs" / f"bench-baseline-{ref}"
    if not (tree / "qrag_ray").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                       capture_output=True)
    return tree


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


def app_env(tree: Path) -> dict:
    return {"env_vars": {**ENV, "PYTHONPATH": f"{tree}:{ROOT / 'benchmarks'}"}}


def check_trees(base: Path) -> None:
    """Each app's runtime_env imports qrag_ray from its own tree (a Ray task with the same runtime_env
    as the app's replicas says where it found it)."""
    import ray

    @ray.remote(num_cpus=0)
    def qrag_ray_file() -> str:
        import qrag_ray

        return qrag_ray.__file__

    for tree in (base, ROOT):
        found = Path(ray.get(qrag_ray_file.options(runtime_env=app_env(tree)).remote()))
        if found.resolve() != (tree / "qrag_ray" / "__init__.py").resolve():
            raise RuntimeError(f"an app with PYTHONPATH={tree} imports qrag_ray from {found}")


def ingress_env(serve_env: str) -> None:
    """The layout's environment, set before Ray starts (its processes read it when they start): `tuned`,
    qrag's SERVE_PROCESS_ENV (through Serve's HTTP proxy); `direct`, that and direct ingress (each app's
    ingress replica serves HTTP itself); `haproxy`, that and Serve's HAProxy ingress in front of the
    replicas' own ports (the RayService layout with Serve's high-throughput ingress). The replicas' ports
    and HAProxy's files and ports are this run's own: the box is shared."""
    import random

    from qrag_ray.serving.config import SERVE_PROCESS_ENV, haproxy_env

    os.environ.update(SERVE_PROCESS_ENV)
    if serve_env in ("direct", "haproxy"):
        lo = random.randrange(20000, 29000, 64)
        for var, val in {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": lo,
                         "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": lo + 63,
                         "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": lo + 20000,
                         "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": lo + 20063}.items():
            os.environ.setdefault(var, str(val))  # a cluster started for the run (RAY_ADDRESS) set its own
    if serve_env == "haproxy":
        env = haproxy_env()
        atexit.register(shutil.rmtree, env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"], True)
        for var, val in env.items():
            os.environ.setdefault(var, val)
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")


def start_ray() -> None:
    """A local Ray for the benchmark, logical CPUs for every replica of two apps; or, with RAY_ADDRESS, the
    cluster started for the run (with the layout's environment, and QRAG_BENCH_RAY_TEMP_DIR its --temp-dir,
    so that its processes are the ones counted). Ray gives a new raylet a fixed time to register, which a
    busy 2-core box does not always meet: tried three times."""
    import ray

    if address := os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, runtime_env={"env_vars": ENV})
        return
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=16, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                     runtime_env={"env_vars": ENV})
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            ray.shutdown()
            if "timed out during startup" not in str(e) or attempt == 2:
                raise


def direct_ingress_urls(apps: tuple[str, ...], timeout: float = 600) -> dict[str, str]:
    """With direct ingress each app's ingress replica serves HTTP on a port the controller hands out from
    RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT up; its `/-/routes` names the app it serves."""
    import httpx

    lo = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "30000"))
    found: dict[str, str] = {}
    deadline = time.time() + timeout
    while time.time() < deadline and len(found) < len(apps):
        for p in range(lo, lo + 32):
            try:
                routes = httpx.get(f"http://127.0.0.1:{p}/-/routes", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                continue
            for prefix, app in (routes.items() if isinstance(routes, dict) else ()):
                if app in apps:
                    found[app] = f"http://127.0.0.1:{p}{prefix}"
        time.sleep(2)
    if len(found) < len(apps):
        raise RuntimeError(f"direct ingress ports not found for {set(apps) - set(found)}")
    return found


def wait_ready(url: str, timeout: float = 600) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.post(f"{url}/v1/search", json={"query": "for loop", "k": 3}, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"{url} not ready")


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


def ray_cpu_by_process() -> dict[str, float]:
    """CPU seconds so far per Ray process title (ray::ProxyActor, ray::ServeReplica:new:Router, ...) of this
    run's Ray: blocks alternate between the apps, so the delta over a block is that app's cost, the
    figure that survives a shared machine (wall-clock qps there measures the CPU share an app won);
    several processes of one title summed: where a request's CPU goes. A worker's title also names the
    method it runs at the moment (ray::ServeController.listen_for_change), which is dropped: otherwise
    a process whose method changed between two readings would count all its CPU since it started."""
    import psutil

    # this run's Ray only, not another user's on a shared machine: the processes this driver started (its
    # in-process Ray's raylet, GCS, workers and what they started), or those of the cluster started for it
    if tmp := os.environ.get("QRAG_BENCH_RAY_TEMP_DIR"):
        roots = [p for p in psutil.process_iter(["cmdline"]) if any(tmp in a for a in (p.info["cmdline"] or []))]
        procs = list({q.pid: q for r in roots for q in (r, *r.children(recursive=True))}.values())
    else:
        procs = psutil.Process().children(recursive=True)
    return cpu_by_title(procs)


def cpu_by_title(procs: list, every: bool = False) -> dict[str, float]:
    """CPU seconds so far per title of `procs` (psutil processes), several of one title summed: Ray's
    workers (`ray::...`, without the method they run) and Serve's HAProxy ingress, or with `every` each of
    them (another by its command's first word: a raylet, the GCS, an agent)."""
    import psutil

    out: dict[str, float] = {}
    for p in procs:
        try:
            cmd = " ".join(p.cmdline() or []) or p.name()
            if p.name() == "haproxy":  # Serve's HAProxy ingress, this run's own
                name = "haproxy"
            elif cmd.startswith("ray::") or every:
                name = cmd.split()[0].split(".")[0]
            else:
                continue
            t = p.cpu_times()
            out[name] = out.get(name, 0.0) + t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


async def block(url: str, queries: list[str], k: int, concurrency: int) -> tuple[int, int, float, list[float]]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    ok, errors, lat, batches = 0, 0, [], []
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def one(q: str):
            nonlocal ok, errors
            async with sem:
                t0 = time.perf_counter()
                r = await client.post("/v1/search", json={"query": q, "k": k})
                if r.status_code == 200:
                    ok += 1
                    lat.append((time.perf_counter() - t0) * 1000)
                    batches.append(r.json().get("timings", {}).get("embed_batch", 1))
                else:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*[one(q) for q in queries])
        print(f"  {url} c={concurrency}: embed batch sizes mean {statistics.mean(batches or [1]):.1f}", flush=True)
        return ok, errors, time.perf_counter() - t0, lat


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
    import httpx

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
