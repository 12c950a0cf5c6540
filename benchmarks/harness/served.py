"""qrag apps served on this run's Ray: the ingress layout's environment, Ray's start, Serve's start, the
apps deployed declaratively (each from its tree's builder, with `deployments:` overrides as a serve config
gives them), their URLs and their readiness."""

from __future__ import annotations

import atexit
import os
import random
import shutil
import time
from pathlib import Path

from benchmarks.harness.trees import ENV, builder, runtime_env

# default: Serve as it comes; tuned: qrag's SERVE_PROCESS_ENV (what `qrag serve` sets) through Serve's HTTP
# proxy; direct: that and direct ingress (each app's ingress replica serves HTTP on a port of its own);
# haproxy: that behind Serve's HAProxy ingress (the RayService layout)
LAYOUTS = ("default", "tuned", "direct", "haproxy")
LAYOUT_HELP = ("tuned: qrag's SERVE_PROCESS_ENV through Serve's HTTP proxy; direct: that and direct ingress (each "
               "app's ingress replica serves HTTP itself); haproxy: that behind Serve's HAProxy ingress; default: "
               "Serve as it comes")


def ingress_env(layout: str) -> dict[str, str]:
    """Set the layout's environment before Ray starts (its processes read it when they start) and return
    the Serve variables it set. The replicas' ports and HAProxy's files and ports are this run's own (the
    machine is shared); a cluster started for the run (RAY_ADDRESS) keeps what it was started with."""
    if layout == "default":
        return {}
    from qrag_ray.serving.config import SERVE_PROCESS_ENV, haproxy_env

    os.environ.update(SERVE_PROCESS_ENV)
    if layout in ("direct", "haproxy"):
        low = random.randrange(20000, 29000, 64)
        ports = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": 1, "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": low,
                 "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": low + 63,
                 "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": low + 20000,
                 "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": low + 20063}
        for var, value in ports.items():
            os.environ.setdefault(var, str(value))
    if layout == "haproxy":
        env = haproxy_env()
        atexit.register(shutil.rmtree, env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"], True)
        for var, value in env.items():
            os.environ.setdefault(var, value)
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    return {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE")}


def start_ray(num_cpus: int = 16) -> None:
    """A local Ray with logical CPUs for every replica of two apps; or, with RAY_ADDRESS, the cluster
    started for the run. A new raylet has a fixed time to register, which a busy 2-core box does not
    always meet: tried three times."""
    import ray

    if address := os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, runtime_env={"env_vars": ENV})
        return
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False, runtime_env={"env_vars": ENV})
            return
        except Exception as e:  # Ray raises a bare Exception for this
            ray.shutdown()
            if "timed out during startup" not in str(e) or attempt == 2:
                raise


def start_serve():
    """Serve on a free local port: (the client that deploys apps declaratively, the port)."""
    from ray.serve._private.api import serve_start

    from qrag_ray.runtime.ports import free_port

    port = free_port()
    return serve_start(http_options={"host": "127.0.0.1", "port": port}), port


def searcher_names(shards: int, per: int = 1) -> list[str]:
    """The app's ShardSearcher deployments as serve configs name them: ShardSearcher0..G-1, G = shards / per
    rounded up (`shards_per_searcher`)."""
    return [f"ShardSearcher{g}" for g in range(-(-shards // per))]


def fixed(replicas: int | None = None, num_cpus: float | None = None) -> dict:
    """A deployment override: a fixed replica count (instead of the code's autoscaling) and/or num_cpus."""
    out: dict = {}
    if replicas is not None:
        out.update(num_replicas=replicas, autoscaling_config=None)
    if num_cpus is not None:
        out["ray_actor_options"] = {"num_cpus": num_cpus}
    return out


def app_config(name: str, tree: Path, args: dict, deployments: dict[str, dict] | None = None) -> dict:
    """One application of a serve config: `tree`'s builder and runtime_env, `args`, and option overrides by
    deployment name."""
    return {"name": name, "route_prefix": f"/{name}", "import_path": builder(tree), "runtime_env": runtime_env(tree),
            "args": args, "deployments": [{"name": n, **o} for n, o in (deployments or {}).items() if o]}


def deploy(client, apps: list[dict]) -> None:
    """Deploy the applications (their replicas start in the background: wait_ready polls)."""
    from ray.serve.schema import ServeDeploySchema

    client.deploy_apps(ServeDeploySchema(applications=apps))


def app_urls(names: list[str], layout: str, port: int, timeout: float = 600) -> dict[str, str]:
    """Each app's URL: on Serve's port (its proxy, or HAProxy), or with direct ingress the port its ingress
    replica serves (found by its `/-/routes`, from RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT up)."""
    if layout != "direct":
        return {n: f"http://127.0.0.1:{port}/{n}" for n in names}
    import httpx

    low = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "30000"))
    found: dict[str, str] = {}
    deadline = time.time() + timeout
    while time.time() < deadline and len(found) < len(names):
        for port in range(low, low + 32):
            try:
                routes = httpx.get(f"http://127.0.0.1:{port}/-/routes", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                continue
            for prefix, app in (routes.items() if isinstance(routes, dict) else ()):
                if app in names:
                    found[app] = f"http://127.0.0.1:{port}{prefix}".rstrip("/")
        time.sleep(2)
    if len(found) < len(names):
        raise RuntimeError(f"direct ingress ports not found for {sorted(set(names) - set(found))}")
    return found


def wait_ready(url: str, key: str | None = None, timeout: float = 600) -> None:
    """Until the app answers a search (`key`: a tenant's, for a tenants app) with 200."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        try:
            response = httpx.post(f"{url}/v1/search", json={"query": "for loop", "k": 3}, headers=headers, timeout=60)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        time.sleep(2)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s: {last}")


def shutdown() -> None:
    """Serve's apps and this run's Ray, gone."""
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
