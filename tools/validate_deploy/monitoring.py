"""Monitoring: the PodMonitors select every Ray pod on a port that is Ray's metrics-export-port, and the
Grafana dashboard queries only metrics we export (qrag_ray.serving.app_metrics) or Serve's built-ins, read
by a real PromQL parser (promql-parser)."""

from __future__ import annotations

from typing import Iterable

from tools.validate_deploy.kuberay import containers, pod_templates


def check_podmonitors(docs: list[dict]) -> list[str]:
    out = []
    if any(d.get("kind") == "ServiceMonitor" for d in docs):
        out.append("use PodMonitors, not a ServiceMonitor (a RayService has two head services; workers have none)")
    pms = [d for d in docs if d.get("kind") == "PodMonitor"]
    roles = {}
    for monitor in pms:
        if monitor.get("apiVersion") != "monitoring.coreos.com/v1":
            out.append(f"PodMonitor {monitor['metadata'].get('name')}: apiVersion must be monitoring.coreos.com/v1")
        sel = ((monitor.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        role = sel.get("ray.io/node-type")
        eps = (monitor.get("spec") or {}).get("podMetricsEndpoints") or []
        if role not in ("head", "worker") or not eps:
            out.append(f"PodMonitor {monitor['metadata'].get('name')}: needs matchLabels ray.io/node-type head|worker "
                       "and podMetricsEndpoints")
            continue
        roles[role] = [e.get("port") for e in eps]
    for role in ("head", "worker"):
        if role not in roles:
            out.append(f"no PodMonitor selects Ray {role} pods")
    # the named port must exist in every Ray pod of that role and be Ray's metrics-export-port
    for doc in docs:
        if doc.get("kind") not in ("RayJob", "RayService"):
            continue
        for role, params, template in pod_templates(doc):
            for port_name in roles.get(role, []):
                ports = {p.get("name"): p.get("containerPort")
                         for c in containers(template) for p in c.get("ports") or []}
                if port_name not in ports:
                    out.append(f"{doc['kind']} {doc['metadata']['name']}: a {role} pod has no container port named "
                               f"{port_name!r}")
                elif str(params.get("metrics-export-port")) != str(ports[port_name]):
                    out.append(f"{doc['kind']} {doc['metadata']['name']}: {role} port {port_name} ({ports[port_name]}) "
                               f"is not rayStartParams.metrics-export-port ({params.get('metrics-export-port')})")
    return out


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (its vector and range selectors); raises ValueError when
    the expression does not parse."""
    import promql_parser

    try:
        ast = promql_parser.parse(expr)
    except Exception as error:  # the binding raises its own error types
        raise ValueError(f"not PromQL: {error}") from None
    names: set[str] = set()

    def visit(node) -> None:
        if type(node).__name__ == "VectorSelector":
            name = node.name or next((m.value for m in node.matchers.matchers if m.name == "__name__"), None)
            if name:
                names.add(name)

    promql_parser.walk(ast, visit)
    return names


def dashboard_exprs(dash: dict) -> list[str]:
    exprs = []

    def walk(panels):
        for panel in panels or []:
            exprs.extend(t["expr"] for t in panel.get("targets") or [] if t.get("expr"))
            walk(panel.get("panels"))

    walk(dash.get("panels"))
    return exprs


def check_dashboard(dash: dict, exported: Iterable[str]) -> list[str]:
    exported = set(exported)
    out = []
    exprs = dashboard_exprs(dash)
    if not exprs:
        return ["the dashboard has no queries"]
    used_ours = False
    for expr in exprs:
        try:
            used = promql_metric_names(expr)
        except ValueError as err:
            out.append(f"query {expr!r}: {err}")
            continue
        for name in used:
            if name in exported:
                used_ours = True
            elif not name.startswith("ray_serve_"):
                out.append(f"query {expr!r} uses {name}, which is neither in "
                           "qrag_ray.serving.app_metrics.EXPORTED_METRICS nor a Ray Serve built-in (ray_serve_*)")
    if not used_ours and not out:
        out.append("the dashboard charts none of our exported metrics")
    return out


def exported_metrics() -> dict[str, str]:
    from qrag_ray.serving.app_metrics import EXPORTED_METRICS

    return dict(EXPORTED_METRICS)
