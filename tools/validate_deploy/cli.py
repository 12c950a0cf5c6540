"""Whole overlays and the repository, and the command line (`python -m tools.validate_deploy`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import yaml

from tools.validate_deploy import REPO, autoscaling, console, kuberay, launcher, monitoring, pods, security, serve
from tools.validate_deploy.render import RenderError, load_docs, render_kustomization, render_with_components

OVERLAYS = {"cpu-dev": {"gpu": False}, "gpu-prod": {"gpu": True}}
CLUSTER_LAUNCHER = REPO / "cluster" / "cloud-gpu.yaml"


@dataclass
class Report:
    """Problems found, each prefixed with where it is (file or resource)."""

    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def add(self, where: str, msg: str) -> None:
        self.problems.append(f"{where}: {msg}")

    def extend(self, where: str, msgs: Iterable[str]) -> None:
        for msg in msgs:
            self.add(where, msg)

    @property
    def ok(self) -> bool:
        return not self.problems


def validate_docs(docs: list[dict], *, require_gpu: bool, canonical_serve: dict | None = None,
                  exported: Iterable[str] | None = None, report: Report | None = None, where: str = "",
                  console_open: bool = False) -> Report:
    """Every check of one set of manifests; `console_open`: rendered with k8s/components/console (else the
    console must be off)."""
    report = report or Report()
    kinds = [d.get("kind") for d in docs]
    for need in ("RayJob", "RayService", "PodMonitor"):
        if need not in kinds:
            report.add(where, f"no {need} in the manifests")
    configmaps = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}
    for doc in docs:
        named = isinstance(doc, dict) and (doc.get("metadata") or {}).get("name")
        if not named or not doc.get("apiVersion") or not doc.get("kind"):
            report.add(where, f"a resource lacks apiVersion/kind/metadata.name: {str(doc)[:80]}")
            continue
        resource = f"{where}{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "RayService":
            report.extend(resource, kuberay.check_rayservice(doc, require_gpu=require_gpu, canonical=canonical_serve))
            if not console_open:
                report.extend(resource, console.check_console_off(console.serve_config_of(doc)))
            report.extend(resource, security.check_ray_resource(doc))
            report.extend(resource, pods.check_pods(doc))
            autoscaling.validate(doc, report, resource)
        elif doc["kind"] == "RayJob":
            report.extend(resource, kuberay.check_rayjob(doc, require_gpu=require_gpu, configmaps=configmaps))
            report.extend(resource, security.check_ray_resource(doc))
            report.extend(resource, pods.check_pods(doc))
        elif doc["kind"] == "ConfigMap" and any(k.endswith(".json") for k in doc.get("data") or {}):
            for key, value in doc["data"].items():
                if key.endswith(".json"):
                    try:
                        dash = json.loads(value)
                    except json.JSONDecodeError as error:
                        report.add(resource, f"{key} is not JSON: {error}")
                        continue
                    metrics = exported if exported is not None else monitoring.exported_metrics()
                    report.extend(f"{resource}[{key}]", monitoring.check_dashboard(dash, metrics))
        report.checked.append(resource)
    report.extend(where + "monitoring", monitoring.check_podmonitors(docs))
    report.extend(where + "security", security.check_manifests(docs))
    return report


def validate_overlay(path: str | Path, *, require_gpu: bool, canonical_serve: dict | None = None,
                     exported: Iterable[str] | None = None, report: Report | None = None) -> Report:
    path = Path(path)
    report = report or Report()
    try:
        docs = render_kustomization(path)
    except (RenderError, OSError, yaml.YAMLError) as error:
        report.add(str(path), f"cannot render: {error}")
        return report
    return validate_docs(docs, require_gpu=require_gpu, canonical_serve=canonical_serve, exported=exported,
                         report=report, where=f"{path.name}: ")


def validate_node_selectors(root: Path, report: Report) -> Report:
    """Each node-selector component (k8s/components/gpu-nodes-*) renders onto every GPU overlay and selects
    the nodes of every GPU group, and of no CPU group."""
    found = sorted((root / "k8s" / "components").glob("gpu-nodes-*"))
    if not found:
        report.add("k8s/components", "no gpu-nodes-* component: the GPU node selector patch users apply")
    for comp in found:
        for name in (n for n, opts in OVERLAYS.items() if opts["gpu"]):
            where = f"{name} + components/{comp.name}"
            try:
                docs = render_with_components(root / "k8s" / "overlays" / name, [comp])
            except (RenderError, OSError, yaml.YAMLError) as error:
                report.add(where, f"cannot render: {error}")
                continue
            report.extend(where, pods.check_node_selector_component(docs, comp.name))
            report.checked.append(where)
    return report


def validate_console_component(root: Path, canonical: dict, report: Report) -> Report:
    """The console component (k8s/components/console) on every overlay: it opens the console and nothing
    else, and the opened manifests pass every other check."""
    comp = root / "k8s" / "components" / "console"
    if not comp.is_dir():
        report.add("k8s/components", "no console component: the one way an operator opens /console")
        return report
    for name, opts in OVERLAYS.items():
        where = f"{name} + components/console"
        try:
            plain = render_kustomization(root / "k8s" / "overlays" / name)
            opened = render_with_components(root / "k8s" / "overlays" / name, [comp])
        except (RenderError, OSError, yaml.YAMLError) as e:
            report.add(where, f"cannot render: {e}")
            continue
        report.extend(where, console.check_console_component(plain, opened, canonical))
        validate_docs(opened, require_gpu=opts["gpu"], canonical_serve=console.with_console(canonical),
                      report=report, where=f"{where}: ", console_open=True)
    return report


def validate_repo(root: Path = REPO) -> Report:
    report = Report()
    canonical = serve.load_canonical_serve_config(root / "serve_configs" / "qrag.yaml")
    report.extend("serve_configs/qrag.yaml", serve.check_serve_config(canonical))
    report.extend("serve_configs/qrag.yaml", console.check_console_off(canonical))
    for name, opts in OVERLAYS.items():
        validate_overlay(root / "k8s" / "overlays" / name, require_gpu=opts["gpu"], canonical_serve=canonical,
                         report=report)
    validate_node_selectors(root, report)
    validate_console_component(root, canonical, report)
    report.extend("cluster/cloud-gpu.yaml",
                  launcher.check_cluster_launcher(yaml.safe_load((root / "cluster" / "cloud-gpu.yaml").read_text())))
    return report


def main(argv: list[str] | None = None) -> int:
    from tools.validate_deploy import __doc__ as doc

    parser = argparse.ArgumentParser(prog="python -m tools.validate_deploy", description=doc.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="overlay directories or YAML files (default: the whole repo)")
    parser.add_argument("--gpu", action="store_true", help="require a GPU worker group (for given paths)")
    parser.add_argument("--sync-serve-config", action="store_true",
                        help="regenerate serveConfigV2 in k8s/base/rayservice.yaml (and, with the console on, in "
                             "k8s/components/console) from serve_configs/qrag.yaml")
    args = parser.parse_args(argv)
    if args.sync_serve_config:
        changed = serve.sync_serve_config()
        print(f"k8s/base/rayservice.yaml: serveConfigV2 {'updated' if changed else 'already in sync'}")
        changed = console.sync_console_patch()
        print(f"k8s/components/console: serveConfigV2 {'updated' if changed else 'already in sync'}")
    if args.paths:
        report = Report()
        canonical = serve.load_canonical_serve_config()
        for path in map(Path, args.paths):
            if path.is_dir():
                validate_overlay(path, require_gpu=args.gpu, canonical_serve=canonical, report=report)
            elif "available_node_types" in path.read_text():
                report.extend(str(path), launcher.check_cluster_launcher(yaml.safe_load(path.read_text())))
            else:
                validate_docs(load_docs(path), require_gpu=args.gpu, canonical_serve=canonical, report=report,
                              where=f"{path}: ")
    else:
        report = validate_repo()
    for msg in report.problems:
        print(f"error: {msg}", file=sys.stderr)
    print(f"{len(report.checked)} resources checked, {len(report.problems)} problems")
    return 0 if report.ok else 1
