"""Pure parts of the rehearsal (cluster/rehearse.py, cluster/pod_layout.py): the rendered RayJob read as the
pods KubeRay starts (resources as KubeRay gives them to `ray start`), the pod paths moved to local folders,
and the submission KubeRay's submitter makes. The rehearsal itself runs in test_local_cluster.py."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cluster import local_cluster, rehearse
from cluster.pod_layout import POD_HOME, Mount, Pod, job_plan, local_paths, map_text
from cluster.readonly import readonly_wrapper
from tools.validate_deploy.render import render_kustomization

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


@pytest.fixture(scope="module")
def plans():
    return {o: job_plan(render_kustomization(REPO / "k8s" / "overlays" / o)) for o in ("cpu-dev", "gpu-prod")}


def _shape(plan):
    return [(p.name, p.num_cpus, p.num_gpus, p.memory // GiB) for p in plan.pods]


def test_cpu_dev_is_a_head_without_cpus_and_two_four_cpu_workers(plans):
    assert _shape(plans["cpu-dev"]) == [("head", 0, 0, 8), ("cpu-workers-0", 4, 0, 12), ("cpu-workers-1", 4, 0, 12)]
    assert plans["cpu-dev"].runtime_env == {"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                                         "TOKENIZERS_PARALLELISM": "false"}}
    assert list(plans["cpu-dev"].files) == ["/etc/qrag/index.yaml"]
    assert "backend: vllm" in plans["cpu-dev"].files["/etc/qrag/index.yaml"]


def test_gpu_prod_gpu_group_starts_with_one_pod_unless_told(plans):
    assert _shape(plans["gpu-prod"]) == [("head", 0, 0, 8), ("cpu-workers-0", 8, 0, 32), ("cpu-workers-1", 8, 0, 32),
                                         ("gpu-workers-0", 8, 1, 32)]
    docs = render_kustomization(REPO / "k8s" / "overlays" / "gpu-prod")
    plan = job_plan(docs, {"cpu-workers": 1, "gpu-workers": 3})
    assert [p.group for p in plan.pods] == ["head", "cpu-workers", "gpu-workers", "gpu-workers", "gpu-workers"]
    assert sum(p.num_gpus for p in plan.pods) == 3
    with pytest.raises(ValueError, match="no worker group"):
        job_plan(docs, {"gpu": 1})


def test_rayjob_resources_follow_kuberay():
    limits = {"cpu": "1500m", "memory": "2Gi", "nvidia.com/gpu": "2"}
    tpl = {"spec": {"containers": [{"resources": {"limits": limits}}]}}
    docs = [{"kind": "RayJob", "metadata": {"name": "qrag-index"},
             "spec": {"entrypoint": "qrag  index\n --input x", "rayClusterSpec": {
                 "headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "template": tpl},
                 "workerGroupSpecs": [{"groupName": "w", "replicas": 0, "template": tpl}]}}}]
    plan = job_plan(docs)
    assert _shape(plan) == [("head", 0, 2, 2), ("w-0", 2, 2, 2)]  # CPUs rounded up; num-cpus wins
    assert plan.entrypoint == "qrag index --input x" and plan.runtime_env == {}


def test_pod_paths_map_to_local_folders(plans, tmp_path):
    gpu = next(p for p in plans["gpu-prod"].pods if p.group == "gpu-workers")
    paths = local_paths(gpu, tmp_path)
    assert paths[POD_HOME] == tmp_path / "pods" / gpu.name / "home"
    assert paths["/tmp"] == tmp_path / "pods" / gpu.name / "volumes" / "tmp"  # each pod its own emptyDir
    assert paths["/mnt/qrag"] == tmp_path / "persistentVolumeClaim" / "qrag-data"  # one volume for all
    assert "/dev/shm" not in paths  # the machine's own
    head = local_paths(plans["gpu-prod"].pods[0], tmp_path)
    assert head["/etc/qrag"] == tmp_path / "configMap" / "qrag-index-config"


def test_map_text_rewrites_whole_paths_once():
    paths = {"/tmp": Path("/tmp/r/pods/head/tmp"), "/mnt/qrag": Path("/tmp/r/pvc"), "/mnt/qrag/cache": Path("/c")}
    assert map_text("--out /mnt/qrag/idx --cache /mnt/qrag/cache/q", paths) == "--out /tmp/r/pvc/idx --cache /c/q"
    assert map_text("XDG=/tmp/.cache", paths) == "XDG=/tmp/r/pods/head/tmp/.cache"  # not rewritten twice
    assert map_text("/tmpfoo /mnt/qragx a/tmp", paths) == "/tmpfoo /mnt/qragx a/tmp"
    assert map_text('{"model": "/mnt/qrag"}', paths) == '{"model": "/tmp/r/pvc"}'


def test_settings_change_the_index_config():
    text = "generator:\n  backend: vllm\n  questions: 10\nfaiss: {factory: IVF4096}\n"
    out = rehearse.apply_settings(text, {"generator.questions": "3", "faiss.factory": "Flat",
                                         "build.keep_work": "true"})
    import yaml

    assert yaml.safe_load(out) == {"generator": {"backend": "vllm", "questions": 3}, "faiss": {"factory": "Flat"},
                                   "build": {"keep_work": True}}
    assert rehearse.apply_settings(text, {}) == text


@pytest.mark.parametrize("fmt", ["jsonl", "msmarco"])
def test_the_corpus_is_written_in_the_entrypoints_format(tmp_path, fmt):
    from qrag_ray.io.readers import parse_jsonl_line, parse_msmarco_line

    path = tmp_path / "c" / "corpus.txt"
    rehearse.write_corpus(path, fmt, 3)
    lines = path.read_text().splitlines()
    parse = parse_msmarco_line if fmt == "msmarco" else (lambda line, w: parse_jsonl_line(line, w, None))
    recs = [parse(line, "c") for line in lines]
    assert len(recs) == 3 and len({r["doc_id"] for r in recs}) == 3 and all(len(r["text"]) > 100 for r in recs)


def test_prepare_lays_out_the_pods_and_the_submission(tmp_path):
    rehearsal = rehearse.prepare("cpu-dev", tmp_path, env={"QRAG_KERNELS": "cpu"}, token="t0k3n")
    assert [s.name for s in rehearsal.shapes] == ["head", "cpu-workers-0", "cpu-workers-1"]
    head = rehearsal.shapes[0]
    assert head.num_cpus == 0 and head.memory == 8 * GiB
    assert head.env["RAY_AUTH_TOKEN"] == "t0k3n" and head.env["RAY_AUTH_MODE"] == "token"
    home = Path(head.env["HOME"])
    assert home == tmp_path / "pods" / "head" / "home" and str(home) in head.readonly
    assert head.env["XDG_CACHE_HOME"] == str(tmp_path / "pods" / "head" / "volumes" / "tmp" / ".cache")
    assert (tmp_path / "configMap" / "qrag-index-config" / "index.yaml").is_file()
    assert Path(rehearsal.params["input"]).is_file() and rehearsal.params["address"] == "auto"
    env_vars = rehearsal.runtime_env["env_vars"]
    assert env_vars["QRAG_KERNELS"] == "cpu" and env_vars["HF_HUB_OFFLINE"] == "1"
    rehearsal.state = local_cluster.ClusterState("x", str(tmp_path), 27000, "127.0.0.1:27000", "http://127.0.0.1:27002",
                                                 27001)
    cmd = rehearse.submit_command(rehearsal)
    # KubeRay's K8sJobMode submitter: ray job submit --address --runtime-env-json --submission-id -- entrypoint
    assert cmd[1:5] == ["job", "submit", "--address", "http://127.0.0.1:27002"]
    assert json.loads(cmd[cmd.index("--runtime-env-json") + 1]) == rehearsal.runtime_env
    # the submitter's shell splits the entrypoint into words (one word would be a program named by all of it)
    entrypoint = cmd[cmd.index("--") + 1:]
    assert entrypoint == shlex.split(rehearsal.entrypoint) and entrypoint[:2] == ["qrag", "index"]
    assert str(tmp_path) in rehearsal.entrypoint and "/mnt/qrag" not in rehearsal.entrypoint


def test_read_only_folders_are_a_mount_namespace_for_root_and_file_modes_otherwise(monkeypatch, tmp_path):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    wrapper = readonly_wrapper(["/a", "/b"])
    assert wrapper[:2] == ["unshare", "--mount"] and wrapper[-3:] == ["/a", "/b", "--"]
    assert readonly_wrapper([]) == []
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert readonly_wrapper(["/a"]) == []


def test_a_node_shape_reaches_ray_start():
    shapes = [local_cluster.NodeShape("head", 0, memory=8 * GiB),
              local_cluster.NodeShape("gpu-workers-0", 8, num_gpus=1, memory=32 * GiB)]
    state = local_cluster.ClusterState("t", "/tmp/qrag-lc-t", 27000, "127.0.0.1:27000", "", 27001,
                                       local_cluster.plan_nodes(27000, 0, 0, 0, shapes))
    gpu = local_cluster.ray_start_command(state, state.nodes[1], 300)
    assert gpu[gpu.index("--num-gpus") + 1] == "1" and gpu[gpu.index("--memory") + 1] == str(32 * GiB)
    assert json.loads(gpu[gpu.index("--resources") + 1]) == {"gpu-workers-0": 1.0}


def test_a_pod_without_limits_declares_nothing():
    pod = Pod("x", "x", 0, 0, 0, {}, (Mount("/tmp", "emptyDir", "tmp"),))
    assert local_paths(pod, Path("/r")) == {POD_HOME: Path("/r/pods/x/home"), "/tmp": Path("/r/pods/x/volumes/tmp")}
