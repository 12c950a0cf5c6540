"""qrag apps on this run's Ray, this tree's and a baseline commit's side by side: the baseline's git
worktree, each app's runtime_env, the ingress layout's environment, Ray's start, the apps' URLs, and a
block of concurrent searches. Import it before anything that starts Ray: it takes this tree off sys.path
(see below)."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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


async def block(url: str, queries: list[str], k: int, concurrency: int) -> tuple[int, int, float, list[float]]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    ok, errors, lat, batches, searched = 0, 0, [], [], []
    per_query = {"merge_ms": [], "format_ms": []}  # a pass's time on the Router's loop, per query of the pass
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
                    timings = r.json().get("timings", {})
                    batches.append(timings.get("embed_batch", 1))
                    searched.append(timings.get("search_batch", 1))
                    for name, v in per_query.items():
                        v.append(timings.get(name, 0.0) / timings.get("search_batch", 1))
                else:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*[one(q) for q in queries])
        print(f"  {url} c={concurrency}: embed batch sizes mean {statistics.mean(batches or [1]):.1f}, "
              f"search batch sizes mean {statistics.mean(searched or [1]):.1f} "
              f"({sum(1 / b for b in searched) / max(1, len(searched)):.3f} search passes per request); the pass's "
              + ", ".join(f"{n} {statistics.mean(v or [0.0]):.3f}" for n, v in per_query.items()) + " per query",
              flush=True)
        return ok, errors, time.perf_counter() - t0, lat
