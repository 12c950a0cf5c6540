"""Ray's control plane is authenticated wherever the project starts or joins Ray.

A real head started the project's way (cluster/local_cluster.py, dashboard on) with its token in a file
of this test (RAY_AUTH_TOKEN_PATH): the real Jobs API refuses a submission without the token (401) or
with a wrong one (403) and runs one that carries it; `qrag index --address` without the token fails with
one line saying what to set; the local Ray of `ensure_ray` runs in token mode with no setup; a job submitted
with the RayJob's own runtime env (what KubeRay sends) joins through `ensure_ray` and a variable of the
user's own reaches its workers.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from cluster import local_cluster
from cluster import node_processes as procs
from support.cluster_procs import native_processes_in_token_mode

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "token"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def head(token_file):
    """A one-node cluster (head with 1 CPU and its dashboard) started by the script's CLI in a process of
    its own, in token mode by default: RAY_AUTH_MODE is unset, only the token's file is given. (Ray
    caches a token per process, so this test process never loads one.)"""
    name = f"a{os.getpid() % 100000}"
    cdir = local_cluster.default_dir(name)
    env = _env_without_auth(RAY_AUTH_TOKEN_PATH=str(token_file))
    cli = [sys.executable, "-m", "cluster.local_cluster"]
    result = subprocess.run([*cli, "up", "--name", name, "--workers", "0", "--head-cpus", "1"], env=env,
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        yield SimpleNamespace(**json.loads(result.stdout))
    finally:
        down = subprocess.run([*cli, "down", "--name", name], env=env, capture_output=True, text=True,
                              timeout=300, cwd=REPO)
        assert down.returncode == 0, down.stderr[-3000:]
        assert procs.cluster_pids(cdir) == []


def _jobs_api(url: str, method: str = "GET", body: dict | None = None, token: str | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _run_job(head, token: str, body: dict, timeout: float = 180) -> tuple[str, str]:
    """Submit through the Jobs API and wait for the end: (status, logs)."""
    code, text = _jobs_api(f"{head.dashboard_url}/api/jobs/", "POST", body, token=token)
    assert code == 200, text
    job_id = json.loads(text)["submission_id"]
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        code, text = _jobs_api(f"{head.dashboard_url}/api/jobs/{job_id}", token=token)
        assert code == 200, text
        status = json.loads(text)["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(1)
    code, logs = _jobs_api(f"{head.dashboard_url}/api/jobs/{job_id}/logs", token=token)
    assert code == 200
    return status, json.loads(logs)["logs"]


def _env_without_auth(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS and k != "RAY_ADDRESS"}
    return env | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def test_nodes_run_in_token_mode(head):
    assert native_processes_in_token_mode(Path(head.dir)) == {"gcs_server": 1, "raylet": 1}


def test_jobs_api_refuses_a_submission_without_the_token(head, token_file):
    url = f"{head.dashboard_url}/api/jobs/"
    job = {"entrypoint": "echo unauthenticated"}
    code, text = _jobs_api(url, "POST", job)
    assert code == 401, text
    code, text = _jobs_api(url, "POST", job, token=secrets.token_hex(32))
    assert code == 403, text
    code, _ = _jobs_api(url, token=None)  # listing jobs is refused too
    assert code == 401


def test_jobs_api_runs_a_submission_with_the_token(head, token_file):
    status, logs = _run_job(head, token_file.read_text(),
                            {"entrypoint": "python -c \"print('authenticated job ran')\""},
                            timeout=120)
    assert status == "SUCCEEDED", status
    assert "authenticated job ran" in logs


def test_a_job_with_the_rayjobs_runtime_env_joins_and_a_users_variable_reaches_the_workers(head, token_file):
    """KubeRay submits the RayJob with its runtimeEnvYAML, which sets the variables ensure_ray sets too: Ray
    refused that merge ("Failed to merge the Job's runtime env") before the driver ran a line."""
    job = yaml.safe_load((REPO / "k8s" / "base" / "rayjob-index.yaml").read_text())
    runtime_env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    runtime_env["env_vars"]["QRAG_USERS_OWN"] = "passed through"
    driver = ("import os, ray; from qrag_ray.runtime.ray_start import ensure_ray; ensure_ray('auto'); "
              "f = ray.remote(num_cpus=0)(lambda: [os.environ.get(k) for k in ('QRAG_USERS_OWN', 'HF_HUB_OFFLINE')]); "
              "print('worker env:', ray.get(f.remote()))")
    status, logs = _run_job(head, token_file.read_text(),
                            {"entrypoint": f"{sys.executable} -c \"{driver}\"", "runtime_env": runtime_env})
    assert status == "SUCCEEDED", logs[-3000:]
    assert "worker env: ['passed through', '1']" in logs, logs[-3000:]


def test_a_driver_with_the_token_joins(head, token_file):
    code = ("from qrag_ray.runtime.ray_start import ensure_ray; import ray; ensure_ray(%r);"
            "print(int(ray.cluster_resources()['head']))" % head.address)
    result = subprocess.run([sys.executable, "-c", code], env=_env_without_auth(RAY_AUTH_TOKEN_PATH=str(token_file)),
                            capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "1"


# a refused token waits on Ray's own connection retries: CI runs the missing token, the
# soak tier every case
@pytest.mark.parametrize("case", ["no token", *(pytest.param(case, marks=[pytest.mark.slow, pytest.mark.soak])
                                                for case in ("wrong token", "mode disabled"))])
def test_qrag_index_without_the_token_says_what_to_set(head, tmp_path, token_file, case):
    extra = {"no token": {"HOME": str(tmp_path)},  # no ~/.ray/auth_token either
             "wrong token": {"RAY_AUTH_TOKEN": secrets.token_hex(32)},
             "mode disabled": {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": str(token_file)}}[case]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": "Ray clusters authenticate every client."}) + "\n")
    result = subprocess.run([sys.executable, "-m", "qrag_ray.cli", "index", "--input", str(corpus), "--output",
                             str(tmp_path / "idx"), "--address", head.address],
                            env=_env_without_auth(**extra), capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"Ray cluster at {head.address} requires its authentication token" in errors[0]
    assert "RAY_AUTH_TOKEN" in errors[0] and "RAY_AUTH_TOKEN_PATH" in errors[0]
    if case == "mode disabled":
        assert "RAY_AUTH_MODE=disabled" in errors[0]
    assert not (tmp_path / "idx").exists()


def test_local_ray_of_qrag_runs_in_token_mode_without_setup(tmp_path):
    """ensure_ray(None), as `qrag index` calls it, with no auth variable and an empty home: Ray makes
    the token of the local instance itself."""
    code = ("from qrag_ray.runtime.ray_start import ensure_ray; ensure_ray(None, 2);"
            "from ray._raylet import AuthenticationMode, get_authentication_mode;"
            "import os, ray; print(get_authentication_mode() == AuthenticationMode.TOKEN, os.environ['RAY_AUTH_MODE']);"
            "ray.shutdown()")
    result = subprocess.run([sys.executable, "-c", code], env=_env_without_auth(HOME=str(tmp_path)),
                            capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "True token"
    assert (tmp_path / ".ray" / "auth_token").is_file()
