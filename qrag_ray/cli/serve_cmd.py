"""`qrag serve`: run the Serve app over an index or a tenants file, locally or on a Ray cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import typer

from qrag_ray.cli.app import err
from qrag_ray.errors import QragError
from qrag_ray.runtime.ports import free_port

DEFAULT_PORT = 8000


def load_serve_config(path: str | Path) -> dict:
    """A `serve deploy` YAML, validated with Ray's own ServeDeploySchema (one qrag application)."""
    from pydantic import ValidationError

    from qrag_ray.config.index import format_validation_error
    from qrag_ray.config.yaml_file import read_yaml

    config_path = Path(path)
    data = read_yaml(config_path, "serve config", default={})
    from ray.serve.schema import ServeDeploySchema  # after the cheap checks: importing Serve takes seconds

    try:
        ServeDeploySchema.model_validate(data)
    except ValidationError as error:
        msg = format_validation_error(error).removeprefix("invalid configuration: ")
        raise QragError(f"serve config {config_path} does not match Ray's Serve schema: {msg}") from None
    apps = data.get("applications") or []
    if len(apps) != 1:
        raise QragError(f"serve config {config_path}: expected one application, found {len(apps)}")
    return data


def plan_from_config(data: dict | None, index: str | None, tenants: str | None, llm_url: str | None,
                     llm_model: str | None) -> tuple[dict, dict, dict]:
    """(app args, deployment options by name, http options) from a serve config plus CLI flags."""
    app_cfg = ((data or {}).get("applications") or [{}])[0]
    args: dict[str, Any] = dict(app_cfg.get("args") or {})
    if index or tenants:  # a flag replaces the config's source entirely
        for key, val in (("index", index), ("tenants", tenants)):
            args.pop(key, None)
            if val:
                args[key] = str(Path(val).expanduser().resolve())
    if llm_url:
        args["generator"] = {**(args.get("generator") or {}), "backend": "openai", "base_url": llm_url}
        if llm_model:
            args["generator"]["model"] = llm_model
    return (args, {d["name"]: d for d in app_cfg.get("deployments") or []},
            dict((data or {}).get("http_options") or {}))


INGRESSES = ("proxy", "direct", "haproxy")


def ingress_env(ingress: str, port: int, replicas: int = 16) -> dict[str, str]:
    """The environment of a local Ray for `ingress` (read when its processes start). `direct`: Ray Serve's
    direct ingress (experimental), each Router replica serves HTTP itself on a port from a range that
    starts at the user's port, no proxy hop. `haproxy`: Serve's HAProxy ingress on the user's port in
    front of the replicas' own (direct-ingress) ports (`haproxy_env`)."""
    from qrag_ray.serving.config import haproxy_env

    if ingress == "proxy":
        return {}
    # Serve holds a stopping direct-ingress replica open (30 s by default) so that a load balancer in
    # front can deregister it; this server stops as a whole on Ctrl-C, with nothing in front to drain
    # from, and that wait would hold Ctrl-C for half a minute
    drain = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}
    if ingress == "direct":
        return {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
                "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + replicas - 1), **drain}
    return {**haproxy_env(), **drain}


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def wait_healthy(url: str, timeout_s: float = 300.0) -> dict:
    """Wait for /readyz (the first tenants loaded), then return the admin status where it is open (a
    single-index server), else the readiness body."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/readyz", timeout=10)
            last = response.json()
            if response.status_code == 200:
                status = httpx.get(f"{url}/v1/admin/status", timeout=60)
                return status.json() if status.status_code == 200 else last
        except (httpx.HTTPError, ValueError) as error:
            last = str(error)
        time.sleep(0.5)
    raise QragError(f"the server at {url} did not become healthy in {timeout_s:.0f}s: {last}")


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        index: str | None = typer.Option(None, "--index", help="serve this index as the open default tenant"),
        tenants: str | None = typer.Option(None, "--tenants", help="tenants YAML: every request needs its Bearer key"),
        config: str | None = typer.Option(None, "--config", "-c", help="serve config YAML (serve_configs/*.yaml)"),
        host: str | None = typer.Option(None, "--host", help="bind address (default 127.0.0.1)"),
        port: int | None = typer.Option(None, "--port", help=f"HTTP port (default {DEFAULT_PORT})"),
        address: str | None = typer.Option(None, "--address",
                                           help="Ray cluster address (default: local Ray in-process)"),
        llm_url: str | None = typer.Option(None, "--llm-url",
                                           help="OpenAI-compatible endpoint for mode=hyde and /v1/answer"),
        llm_model: str | None = typer.Option(None, "--llm-model", help="model name at --llm-url"),
        name: str = typer.Option("qrag", "--name", help="Serve application name"),
        detach: bool = typer.Option(False, "--detach",
                                    help="deploy and return (with --address); default: serve until Ctrl-C"),
        ingress: str = typer.Option(
            "proxy", "--ingress", help="local Ray only: what answers on --port: `proxy`, Serve's HTTP proxy; "
            "`haproxy`, Serve's HAProxy ingress (less CPU per request); `direct`, the Router replica itself "
            "(experimental in Ray; more replicas: the next ports) (docs/SERVING.md)"),
        console: bool | None = typer.Option(
            None, "--console/--no-console", help="the browser console at /console (default: on, unless the "
            "--config's args say `console: false`)"),
    ):
        """Serve an index (or many tenants' indexes) over HTTP with Ray Serve."""
        from qrag_ray.index.versions import resolve_index
        from qrag_ray.serving.tenants import load_tenants

        data = load_serve_config(config) if config else None
        args, dep_opts, http = plan_from_config(data, index, tenants, llm_url, llm_model)
        if console is not None:
            args["console"] = console
        args.setdefault("console", True)  # a person's own server: the console is what they look at it with
        if not args.get("index") and not args.get("tenants"):
            raise QragError("give --index DIR or --tenants FILE (or a --config whose args name one)")
        if args.get("index"):
            resolve_index(args["index"])  # reads the manifest: a clear one-line error before Ray starts
        if args.get("tenants"):
            load_tenants(args["tenants"])
        http_host = host or http.get("host", "127.0.0.1")
        http_port = port or http.get("port", DEFAULT_PORT)
        if detach and not address:
            raise QragError("--detach needs --address: a local in-process Ray stops when qrag exits")
        if ingress not in INGRESSES:
            raise QragError(f"--ingress {ingress!r}: one of {', '.join(INGRESSES)}")
        if ingress != "proxy" and address:
            raise QragError(f"--ingress {ingress} starts its own local Ray (the switch is read when Ray's processes "
                            "start); on a cluster set the environment of docs/SERVING.md on every node instead")
        direct_ingress = ingress == "direct"

        import httpx
        import ray
        from ray import serve

        from qrag_ray.runtime.ray_start import ensure_ray
        from qrag_ray.serving.application import compose_app
        from qrag_ray.serving.config import SERVE_PROCESS_ENV

        if not address:
            # the workers inherit this env: Serve's request path tuned (docs/BENCHMARKS.md), and a proxy
            # readiness timeout a busy 2-core laptop can meet (Serve's default is 5 s)
            for var, val in {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", **SERVE_PROCESS_ENV}.items():
                os.environ.setdefault(var, val)
            os.environ.update(ingress_env(ingress, int(http_port)))
        # replica logs (one line per request) stay in Ray's session logs, not on this terminal (qrag -v shows them)
        ensure_ray(address)
        application = compose_app(args, dep_opts)
        # with direct ingress Serve's proxy (whose host the Router's server binds too) gets a free port
        proxy_port = free_port() if direct_ingress else int(http_port)
        serve.start(http_options={"host": http_host, "port": proxy_port})
        serve.run(application, name=name, route_prefix="/", blocking=False)
        url = f"http://{'127.0.0.1' if http_host in ('0.0.0.0', '::') else http_host}:{http_port}"
        health = wait_healthy(url)
        if direct_ingress:
            try:  # what the server on the user's port routes: {route prefix: app name}
                routes = httpx.get(f"{url}/-/routes", timeout=10).json()
            except (httpx.HTTPError, ValueError) as error:
                routes = str(error)
            if routes != {"/": name}:
                raise QragError(f"direct ingress: port {http_port} does not answer as the Router of '{name}' "
                                f"({routes})")
            err.print(f"direct ingress: the Router replica answers on port {http_port} itself "
                      f"(Serve's proxy is on port {proxy_port}, unused)")
        if bad := [t for t in health.get("tenants", []) if t.get("status") != "ok"]:
            err.print(f"[yellow]serving, but with problems:[/] {json.dumps({t['name']: t['problems'] for t in bad})}")
        mode = "tenants (Bearer keys required)" if args.get("tenants") else "open default tenant (no key)"
        err.print(f"qrag serving at {url}  ({mode}); API docs at {url}/docs"
                  + (f"; console at {url}/console" if args["console"] else ""))
        if detach:
            return
        err.print("Ctrl-C to stop")
        # a service manager's or container runtime's stop (SIGTERM) takes Ctrl-C's way out: the app shut
        # down, Ray stopped, HAProxy's files removed (SIGTERM's default ends the process without any of it)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            serve.shutdown()
            ray.shutdown()
            if ingress == "haproxy" and not address:  # HAProxy's files of this server (ingress_env)
                shutil.rmtree(os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"], ignore_errors=True)
