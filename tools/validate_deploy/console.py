"""The browser console on Kubernetes: off in the base RayService and every shipped overlay, opened only by
the explicit component k8s/components/console, which must turn on `args.console` and change nothing else
(no port, no NetworkPolicy, no other app arg). Its patch is generated from serve_configs/qrag.yaml, like
the RayService's own serveConfigV2 (`--sync-serve-config`)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from tools.validate_deploy import REPO
from tools.validate_deploy.serve import SERVE_CONFIG, embed_serve_config

COMPONENT = REPO / "k8s" / "components" / "console"
PATCH = COMPONENT / "rayservice-console.yaml"


def console_serve_yaml(serve_yaml_text: str) -> str:
    """The serve config's text with `console: true` as the first arg of every application (comments kept)."""
    out, done = [], 0
    for line in serve_yaml_text.splitlines(keepends=True):
        out.append(line)
        m = re.match(r"^(\s*)args:\s*$", line)
        if m:
            out.append(f"{m.group(1)}  console: true  # the browser console at /console (k8s/components/console)\n")
            done += 1
    if not done:
        raise ValueError("the serve config has no `args:` block to open the console in")
    return "".join(out)


def with_console(cfg: dict) -> dict:
    """A parsed serve config with every application's args.console on (what the component must serve)."""
    out = copy.deepcopy(cfg)
    for app in out.get("applications") or []:
        app["args"] = {"console": True, **(app.get("args") or {})}
    return out


def sync_console_patch(patch: Path = PATCH, serve_config: Path = SERVE_CONFIG) -> bool:
    """Rewrite the component's serveConfigV2 from serve_config with the console on; True when it changed."""
    old = patch.read_text()
    new = embed_serve_config(old, console_serve_yaml(serve_config.read_text()), key="value")
    embedded = yaml.safe_load(yaml.safe_load(new)[0]["value"])
    if embedded != with_console(yaml.safe_load(serve_config.read_text())):
        raise AssertionError("embedding the serve config with the console on changed its content")
    if new != old:
        patch.write_text(new)
    return new != old


def serve_config_of(doc: dict) -> Any:
    """A RayService's serveConfigV2, parsed (None where it is not YAML: the RayService checks report that)."""
    try:
        return yaml.safe_load((doc.get("spec") or {}).get("serveConfigV2") or "")
    except yaml.YAMLError:
        return None


def check_console_off(cfg: Any) -> list[str]:
    """A shipped serve config (serve_configs/qrag.yaml, a RayService's serveConfigV2) leaves the console off:
    only k8s/components/console opens it."""
    apps = cfg.get("applications") if isinstance(cfg, dict) else None
    found = [(a.get("name", "?"), (a.get("args") or {}).get("console")) for a in apps or [] if isinstance(a, dict)]
    return [f"application {name}: args.console is {value!r}; the console is opened only by adding "
            "k8s/components/console to an overlay" for name, value in found if value not in (None, False)]


def _without_serve_config(docs: list[dict]) -> list[dict]:
    out = copy.deepcopy(docs)
    for d in out:
        if d.get("kind") == "RayService":
            d.get("spec", {}).pop("serveConfigV2", None)
    return out


def check_console_component(plain: list[dict], opened: list[dict], canonical: dict) -> list[str]:
    """An overlay rendered without (`plain`) and with (`opened`) the console component: the component
    serves the canonical config with the console on, and every other field of every resource is the same."""
    out = []
    services = [d for d in opened if d.get("kind") == "RayService"]
    if not services:
        return ["no RayService to open the console in"]
    for doc in services:
        if serve_config_of(doc) != with_console(canonical):
            out.append("serveConfigV2 is not serve_configs/qrag.yaml with args.console: true; run "
                       "`python -m tools.validate_deploy --sync-serve-config`")
    if _without_serve_config(plain) != _without_serve_config(opened):
        out.append("the component changes more than serveConfigV2 (a port, a NetworkPolicy, a pod): it may only "
                   "turn the console on")
    return out
