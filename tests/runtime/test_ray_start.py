"""How a driver starts or joins Ray: inside a Ray job (`ray job submit`, a KubeRay RayJob) its runtime env
combines with the job's instead of clashing with it, the local Ray's logical CPUs are the caller's choice,
and no module but runtime/ray_start.py calls ray.init."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from qrag_ray.runtime.ray_start import (
    JOB_CONFIG_VAR,
    LOCAL_MIN_CPUS,
    PROCESS_ENV,
    driver_runtime_env,
    job_runtime_env,
    local_num_cpus,
)

PACKAGE = Path(__file__).resolve().parents[2] / "qrag_ray"
# the runtime env of the shipped RayJob (k8s/base/rayjob-index.yaml) plus a variable of the user's own
KUBERAY_JOB_ENV = {"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                "MY_SETTING": "42"}}


def _ray_would_merge(job_env: dict, driver_env: dict) -> dict | None:
    """Ray's own merge of a job's runtime env with a driver's (None: the conflict ray.init raises on)."""
    from ray.runtime_env.runtime_env import _merge_runtime_env

    return _merge_runtime_env(job_env, driver_env)


def test_outside_a_job_the_driver_sets_its_own_env():
    assert driver_runtime_env(None) == {"env_vars": PROCESS_ENV}
    assert driver_runtime_env({"pip": ["x"]}) == {"env_vars": PROCESS_ENV}


def test_inside_the_rayjob_the_envs_combine_and_the_users_variable_passes():
    mine = driver_runtime_env(KUBERAY_JOB_ENV)
    merged = _ray_would_merge(KUBERAY_JOB_ENV, mine)
    assert merged is not None, "Ray refuses the merge"
    assert merged["env_vars"] == KUBERAY_JOB_ENV["env_vars"]  # nothing of the job's lost or changed


def test_a_job_value_wins_and_the_missing_ones_are_added():
    job = {"env_vars": {"HF_HUB_OFFLINE": "0", "OTHER": "x"}, "working_dir": "/w"}
    merged = _ray_would_merge(job, driver_runtime_env(job))
    assert merged is not None
    assert merged["env_vars"] == {**PROCESS_ENV, "HF_HUB_OFFLINE": "0", "OTHER": "x"}
    assert merged["working_dir"] == "/w"


def test_the_jobs_runtime_env_is_read_from_rays_variable(monkeypatch):
    monkeypatch.delenv(JOB_CONFIG_VAR, raising=False)
    assert job_runtime_env() is None
    monkeypatch.setenv(JOB_CONFIG_VAR, json.dumps({"runtime_env": KUBERAY_JOB_ENV, "metadata": {}}))
    assert job_runtime_env() == KUBERAY_JOB_ENV
    monkeypatch.setenv(JOB_CONFIG_VAR, json.dumps({"metadata": {}}))
    assert job_runtime_env() is None


def test_local_cpus_are_the_cores_at_least_four_and_inflated_only_for_vllm_on_cpu(monkeypatch):
    assert local_num_cpus(vllm_on_cpu=False, cores=16) == 16
    assert local_num_cpus(vllm_on_cpu=True, cores=16) == 64
    # a small machine: the stream's stages held at once and one over, not its 2 cores
    assert local_num_cpus(vllm_on_cpu=False, cores=2) == LOCAL_MIN_CPUS == 4
    assert local_num_cpus(vllm_on_cpu=True, cores=1) == 8
    monkeypatch.setattr("os.cpu_count", lambda: 6)  # the default: this machine's cores
    assert local_num_cpus(vllm_on_cpu=False) == 6 and local_num_cpus() == 24


def _calls_ray_init(source: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "init"
               and isinstance(n.func.value, ast.Name) and n.func.value.id == "ray" for n in ast.walk(ast.parse(source)))


def test_ray_is_started_in_one_place():
    callers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if _calls_ray_init(p.read_text()))
    assert callers == ["runtime/ray_start.py"], callers
