"""The LLM stage's and the embedder's start-up with a read-only home and only the pod's mounted folders
writable, as the pods run (readOnlyRootFilesystem): Ray Data LLM's model helper, which every vLLM stage
actor and the driver call (it makes torch's kernels dir under torch's home), and the embedder's load and
first encode, in a process whose environment is a Ray container's of the rendered overlays (its paths
moved to local folders) and whose home cannot be written (a read-only bind mount for root, no write bits
otherwise: cluster/readonly.py). The same process without the pod's environment fails, so the test can.
The whole job with a read-only home runs in the rehearsal (test_local_cluster.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.pod_layout import POD_HOME, job_plan, local_paths, map_env
from cluster.readonly import make_readonly, readonly_wrapper
from tools.validate_deploy.render import render_kustomization

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

PROBE = """
import os, sys
try:
    open(os.path.join(os.environ["HOME"], "probe"), "w")
    sys.exit("the home is writable: the test would prove nothing")
except OSError:
    pass
from ray.llm._internal.common.utils.download_utils import download_model_files
download_model_files(model_id=sys.argv[1])  # a local model folder: only the helper's own set-up runs
from qrag_ray.embedding import encode, load_sentence_transformer
print("vectors", encode(load_sentence_transformer("all-MiniLM-L6-v2", device="cpu"), ["a read-only home"]).shape)
"""


def _run(tmp_path: Path, env_of_pod: dict[str, str] | None) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (tmp_path / "model").mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HOME": str(home), **(env_of_pod or {})}
    make_readonly([str(home)])
    try:
        return subprocess.run([*readonly_wrapper([str(home)]), sys.executable, "-c", PROBE, str(tmp_path / "model")],
                              env=env, capture_output=True, text=True, timeout=600)
    finally:
        make_readonly([str(home)], writable=True)


def _pod_env(overlay: str, group: str, tmp_path: Path) -> dict[str, str]:
    pod = next(p for p in job_plan(render_kustomization(REPO / "k8s" / "overlays" / overlay)).pods if p.group == group)
    paths = local_paths(pod, tmp_path / "pods")
    for pod_path, local in paths.items():
        if pod_path != POD_HOME:
            local.mkdir(parents=True, exist_ok=True)
    return map_env(pod.env, paths)


# the head runs the driver, a GPU worker the engines and the embedder; every Ray container carries the same env
@pytest.mark.parametrize("overlay, group", [("cpu-dev", "head"), ("gpu-prod", "gpu-workers")])
def test_llm_helper_and_embedder_start_with_a_read_only_home(tmp_path, overlay, group):
    env = _pod_env(overlay, group, tmp_path)
    process = _run(tmp_path, env)
    assert process.returncode == 0, process.stderr[-3000:]
    assert "vectors (1, 384)" in process.stdout
    assert (Path(env["XDG_CACHE_HOME"]) / "torch" / "kernels").is_dir()  # the helper wrote where the pod can


def test_without_the_pods_env_the_llm_helper_fails_on_the_read_only_home(tmp_path):
    process = _run(tmp_path, None)
    assert process.returncode != 0
    assert 'os.makedirs(os.path.join(torch_cache_home, "kernels")' in process.stderr, process.stderr[-3000:]
    assert "Read-only file system" in process.stderr or "Permission denied" in process.stderr, process.stderr[-3000:]
