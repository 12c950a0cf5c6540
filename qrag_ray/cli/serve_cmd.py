"""`qrag serve`, `qrag query` and `qrag tenants`: run the Serve app, query it, manage API keys."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from qrag_ray.cli.app import err
from qrag_ray.errors import QragError
from qrag_ray.ports import free_port

DEFAULT_PORT = 8000


def load_serve_config(path: str | Path) -> dict:
    """A `serve deploy` YAML, validated with Ray's own ServeDeploySchema (one qrag application)."""
    from pydantic import ValidationError

    from qrag_ray.config import format_validation_error
    from qrag_ray.yaml_file import read_yaml

    p = Path(path)
    data = read_yaml(p, "serve config", default={})
    from ray.serve.schema import ServeDeploySchema  # after the cheap checks: importing Serve takes seconds

    try:
        ServeDeploySchema.model_validate(data)
    except ValidationError as e:
        msg = format_validation_error(e).removeprefix("invalid configuration: ")
        raise QragError(f"serve config {p} does not match Ray's Serve schema: {msg}") from None
    apps = data.get("applications") or []
    if len(apps) != 1:
        raise QragError(f"serve config {p}: expected one application, found {len(apps)}")
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


def direct_ingress_env(port: int, replicas: int = 16) -> dict[str, str]:
    """Ray Serve's direct ingress (experimental): each ingress replica serves HTTP itself on a port from
    a range; starting the range at the user's port puts the (first) Router replica on it, no proxy hop."""
    return {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + replicas - 1)}


def wait_healthy(url: str, timeout_s: float = 300.0) -> dict:
    """Wait for /readyz (the first tenants loaded), then return the admin status where it is open (a
    single-index server), else the readiness body."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/readyz", timeout=10)
            last = r.json()
            if r.status_code == 200:
                st = httpx.get(f"{url}/v1/admin/status", timeout=60)
                return st.json() if st.status_code == 200 else last
        except (httpx.HTTPError, ValueError) as e:
            last = str(e)
        time.sleep(0.5)
    raise QragError(f"the server at {url} did not become healthy in {timeout_s:.0f}s: {last}")


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        index: Optional[str] = typer.Option(None, "--index", help="serve this index as the open default tenant"),
        tenants: Optional[str] = typer.Option(None, "--tenants", help="tenants YAML: every request needs its Bearer key"),
        config: Optional[str] = typer.Option(None, "--config", "-c", help="serve config YAML (serve_configs/*.yaml)"),
        host: Optional[str] = typer.Option(None, "--host", help="bind address (default 127.0.0.1)"),
        port: Optional[int] = typer.Option(None, "--port", help=f"HTTP port (default {DEFAULT_PORT})"),
        address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: local Ray in-process)"),
        llm_url: Optional[str] = typer.Option(None, "--llm-url", help="OpenAI-compatible endpoint for mode=hyde and /v1/answer"),
        llm_model: Optional[str] = typer.Option(None, "--llm-model", help="model name at --llm-url"),
        name: str = typer.Option("qrag", "--name", help="Serve application name"),
        detach: bool = typer.Option(False, "--detach", help="deploy and return (with --address); default: serve until Ctrl-C"),
        direct_ingress: bool = typer.Option(
            False, "--direct-ingress", help="local Ray only, experimental in Ray: the Router replica serves HTTP itself "
            "on --port (more replicas: the next ports), no Serve proxy in between (docs/SERVING.md)"),
    ):
        """Serve an index (or many tenants' indexes) over HTTP with Ray Serve."""
        from qrag_ray.index.versions import resolve_index
        from qrag_ray.serving.tenants import load_tenants

        data = load_serve_config(config) if config else None
        args, dep_opts, http = plan_from_config(data, index, tenants, llm_url, llm_model)
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
        if direct_ingress and address:
            raise QragError("--direct-ingress starts its own local Ray (the switch is read when Ray's processes "
                            "start); on a cluster set the environment of docs/SERVING.md on every node instead")

        import httpx
        import ray
        from ray import serve

        from qrag_ray.runtime import join_ray
        from qrag_ray.serving.app import build_application
        from qrag_ray.serving.config import SERVE_PROCESS_ENV

        env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}
        if address:
            join_ray(address, runtime_env=env, logging_level="ERROR")
        else:
            # the workers inherit this env: Serve's request path tuned (docs/BENCHMARKS.md), and a proxy
            # readiness timeout a busy 2-core laptop can meet (Serve's default is 5 s)
            for var, val in {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", **SERVE_PROCESS_ENV}.items():
                os.environ.setdefault(var, val)
            if direct_ingress:
                os.environ.update(direct_ingress_env(int(http_port)))
            # replica logs (one line per request) stay in /tmp/ray/session_*/logs, not on this terminal
            ray.init(address="local", num_cpus=max(8, 4 * (os.cpu_count() or 2)), runtime_env=env,
                     logging_level="ERROR", log_to_driver=False)
        application = build_application(args, dep_opts)
        # with direct ingress Serve's proxy (whose host the Router's server binds too) gets a free port
        proxy_port = free_port() if direct_ingress else int(http_port)
        serve.start(http_options={"host": http_host, "port": proxy_port})
        serve.run(application, name=name, route_prefix="/", blocking=False)
        url = f"http://{'127.0.0.1' if http_host in ('0.0.0.0', '::') else http_host}:{http_port}"
        health = wait_healthy(url)
        if direct_ingress:
            try:  # what the server on the user's port routes: {route prefix: app name}
                routes = httpx.get(f"{url}/-/routes", timeout=10).json()
            except (httpx.HTTPError, ValueError) as e:
                routes = str(e)
            if routes != {"/": name}:
                raise QragError(f"direct ingress: port {http_port} does not answer as the Router of '{name}' ({routes})")
            err.print(f"direct ingress: the Router replica answers on port {http_port} itself "
                      f"(Serve's proxy is on port {proxy_port}, unused)")
        if bad := [t for t in health.get("tenants", []) if t.get("status") != "ok"]:
            err.print(f"[yellow]serving, but with problems:[/] {json.dumps({t['name']: t['problems'] for t in bad})}")
        mode = "tenants (Bearer keys required)" if args.get("tenants") else "open default tenant (no key)"
        err.print(f"qrag serving at {url}  ({mode}); API docs at {url}/docs")
        if detach:
            return
        err.print("Ctrl-C to stop")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            serve.shutdown()
            ray.shutdown()

    @app.command("query")
    def query_cmd(
        text: str = typer.Argument(..., help="the question"),
        url: str = typer.Option("http://127.0.0.1:8000", "--url", help="server URL"),
        key: Optional[str] = typer.Option(None, "--key", envvar="QRAG_API_KEY", help="API key (or $QRAG_API_KEY)"),
        k: int = typer.Option(5, "--k", "-k", help="number of distinct chunks"),
        mode: str = typer.Option("default", "--mode", help="default|hyde"),
        min_score: Optional[float] = typer.Option(None, "--min-score"),
        bm25_alpha: Optional[float] = typer.Option(
            None, "--bm25-alpha", help="hybrid search with this dense weight, 0..1 (index built with BM25)"),
        answer: bool = typer.Option(False, "--answer", help="ask /v1/answer for a cited answer"),
        json_out: bool = typer.Option(False, "--json", help="print the raw JSON response"),
    ):
        """Query a running qrag server and print the results for a person."""
        import httpx

        body = {"query": text, "k": k, "mode": mode, "min_score": min_score, "bm25_alpha": bm25_alpha}
        body = {n: v for n, v in body.items() if v is not None}
        try:
            r = httpx.post(url.rstrip("/") + ("/v1/answer" if answer else "/v1/search"), json=body,
                           headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=120)
        except httpx.HTTPError as e:
            raise QragError(f"cannot reach {url}: {e}") from None
        try:
            data = r.json()
        except ValueError:
            raise QragError(f"{url} answered HTTP {r.status_code} with a non-JSON body") from None
        if r.status_code >= 400:
            raise QragError(f"HTTP {r.status_code} {data.get('error', '')}: {data.get('message', data)}")
        if json_out:
            print(json.dumps(data, indent=2, ensure_ascii=False))
            return
        print_results(data, text, answer)

    tenants_app = typer.Typer(help="Manage the tenants file (API keys are stored as sha256 only).",
                              no_args_is_help=True)
    app.add_typer(tenants_app, name="tenants")

    @tenants_app.command("add")
    def tenants_add(
        file: str = typer.Option(..., "--file", help="tenants YAML (created if missing)"),
        name: str = typer.Option(..., "--name", help="tenant name (also the index name in requests)"),
        index: str = typer.Option(..., "--index", help="the tenant's index directory or versioned root"),
        rps: Optional[float] = typer.Option(None, "--rps", help="rate limit: requests per second per Router replica"),
        burst: Optional[int] = typer.Option(None, "--burst", help="rate limit burst (default 2 x rps)"),
    ):
        """Add a tenant (or replace its entry) and print its new API key once."""
        from pydantic import ValidationError

        from qrag_ray.config import format_validation_error
        from qrag_ray.index.versions import resolve_index
        from qrag_ray.serving.tenants import add_tenant

        resolve_index(index)
        if burst is not None and rps is None:
            raise QragError("--burst needs --rps")
        limit = None if rps is None else {"rps": rps, "burst": burst if burst is not None else max(1, int(2 * rps))}
        try:
            key = add_tenant(file, name, index, rate_limit=limit)
        except ValidationError as e:
            raise QragError(format_validation_error(e)) from None
        _print_key(f"tenant '{name}' -> {Path(index).resolve()} in {file}; its API key (shown once, stored as sha256):",
                   key)

    @tenants_app.command("rotate")
    def tenants_rotate(
        file: str = typer.Option(..., "--file", help="tenants YAML"),
        name: str = typer.Option(..., "--name", help="tenant whose key to replace"),
    ):
        """Give a tenant a new API key (printed once); running servers refuse the old one within seconds."""
        from qrag_ray.serving.tenants import rotate_key

        _print_key(f"tenant '{name}': new API key (shown once; the old key stops working at the servers' next reload):",
                   rotate_key(file, name))

    @tenants_app.command("remove")
    def tenants_remove(
        file: str = typer.Option(..., "--file", help="tenants YAML"),
        name: str = typer.Option(..., "--name", help="tenant to remove"),
    ):
        """Remove a tenant; running servers refuse its key within seconds. Its index is left on disk."""
        from qrag_ray.serving.tenants import remove_tenant

        remove_tenant(file, name)
        err.print(f"tenant '{name}' removed from {file}")

    @tenants_app.command("admin-key")
    def tenants_admin_key(file: str = typer.Option(..., "--file", help="tenants YAML")):
        """Set (or replace) the admin key of GET /v1/admin/status and print it once."""
        from qrag_ray.serving.tenants import set_admin_key

        _print_key(f"admin key for {file} (shown once, stored as sha256):", set_admin_key(file))

    @tenants_app.command("list")
    def tenants_list(file: str = typer.Option(..., "--file", help="tenants YAML")):
        """List tenants and their indexes (never keys)."""
        from qrag_ray.serving.tenants import load_tenants

        for t in load_tenants(file).by_name.values():
            lim = f"\t{t.rate_limit.rps:g} rps, burst {t.rate_limit.burst}" if t.rate_limit else ""
            print(f"{t.name}\t{t.index}{lim}")

    @app.command("publish")
    def publish_cmd(
        index: str = typer.Argument(..., help="a built index directory (qrag index --output)"),
        root: str = typer.Option(..., "--root", help="the versioned root a tenant's `index:` names"),
        keep: int = typer.Option(2, "--keep", help="published versions to keep (>= 2)"),
        rollback: Optional[str] = typer.Option(None, "--rollback", help="instead: point the root back at this version"),
    ):
        """Publish an index as the next version under a root: checked, copied, then CURRENT moves.
        Servers load it on every shard before sending it traffic."""
        from qrag_ray.index import versions

        if rollback:
            versions.rollback(root, rollback)
            err.print(f"{root}: CURRENT -> {rollback}")
            return
        info = versions.publish_version(root, index, keep=keep)
        err.print(
            f"{root}: CURRENT -> {info['index_version']} ({info['num_shards']} shards, {info['vectors']} vectors; "
            f"was {info['previous'] or 'nothing'}; removed {', '.join(info['removed']) or 'none'})")
        print(info["index_version"])


def _print_key(note: str, key: str) -> None:
    """A new secret: what it is on stderr, the key alone on stdout (so a script can capture it)."""
    err.print(note)
    print(key)


def print_results(data: dict, query: str, answer: bool = False) -> None:
    out = Console()
    if answer:
        out.rule(f"[bold]{query}")
        out.print(data.get("answer", ""))
        for c in data.get("citations", []):
            out.print(f"  [{c['n']}] {c['chunk_id']}")
    t = Table(show_lines=True, title=f"{len(data.get('results', []))} results from '{data.get('index')}' (index "
                                     f"{str(data.get('index_version', ''))[:12]}, {data.get('took_ms', 0):.0f} ms)")
    for col in ("#", "score", "chunk", "matched", "text"):
        t.add_column(col, justify="right" if col in ("#", "score") else "left")
    for i, r in enumerate(data.get("results", []), 1):
        best = r["matched"][0] if r.get("matched") else {}
        t.add_row(str(i), f"{r['score']:.3f}", r["chunk_id"],
                  f"{best.get('kind', '')}: {clip(best.get('text', ''), 100)}", clip(r.get("text", ""), 200))
    out.print(t)


def clip(s: str, n: int) -> str:
    """`s` on one line, cut to at most `n` characters."""
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"
