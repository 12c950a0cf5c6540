"""What every Ray pod of the manifests needs to start and be scheduled (tools/validate_deploy/pods.py), each
check shown to pass on the shipped overlays and to fail on a planted error: caches on a writable mount (the
root filesystem, home included, is read-only), /dev/shm at least Ray's object store, GPU pods scheduled by the
GPU request with the node selector a component the user adds (k8s/components/gpu-nodes-*)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tools.validate_deploy import pods
from tools.validate_deploy.cli import OVERLAYS as OVERLAY_NAMES
from tools.validate_deploy.render import render_kustomization, render_with_components

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = sorted((REPO / "k8s" / "components").glob("gpu-nodes-*"))


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render_kustomization(REPO / "k8s" / "overlays" / name) for name in OVERLAY_NAMES}


def _ray_docs(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("RayJob", "RayService")]


def _groups(doc: dict) -> list[dict]:
    spec = doc["spec"].get("rayClusterConfig") or doc["spec"]["rayClusterSpec"]
    return [spec["headGroupSpec"], *spec["workerGroupSpecs"]]


@pytest.mark.parametrize("overlay", sorted(OVERLAY_NAMES))
def test_every_ray_pod_of_the_overlays_has_what_it_needs(overlay, rendered):
    docs = _ray_docs(rendered[overlay])
    assert len(docs) == 2
    for doc in docs:
        assert pods.check_pods(doc) == [], doc["kind"]


def test_planted_pod_without_a_cache_env_fails(rendered):
    for doc in _ray_docs(copy.deepcopy(rendered["gpu-prod"])):
        container = _groups(doc)[-1]["template"]["spec"]["containers"][0]
        container["env"] = [e for e in container["env"] if e["name"] != "XDG_CACHE_HOME"]
        probs = pods.check_cache_env(doc)
        assert len(probs) == 1 and "XDG_CACHE_HOME" in probs[0] and "got nothing" in probs[0], probs


def test_planted_cache_env_in_the_read_only_home_fails(rendered):
    doc = copy.deepcopy(next(x for x in rendered["cpu-dev"] if x["kind"] == "RayJob"))
    container = _groups(doc)[0]["template"]["spec"]["containers"][0]
    for variable in container["env"]:
        if variable["name"] == "XDG_CACHE_HOME":
            variable["value"] = "/home/ray/.cache"
    probs = pods.check_cache_env(doc)
    assert len(probs) == 1 and "head" in probs[0] and "/home/ray/.cache" in probs[0], probs


@pytest.mark.parametrize("plant, expect", [
    (lambda spec, c: c.update(volumeMounts=[m for m in c["volumeMounts"] if m["mountPath"] != "/dev/shm"]),
     "no Memory emptyDir at /dev/shm"),
    (lambda spec, c: next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"].update(sizeLimit="8Gi"),
     "sizeLimit 8Gi is below Ray's object store (9.6 GiB)"),
    (lambda spec, c: next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"].pop("medium"),
     "no Memory emptyDir at /dev/shm"),
], ids=["no-shm", "shm-smaller-than-the-store", "shm-on-disk"])
def test_planted_shm_below_the_object_store_fails(rendered, plant, expect):
    for doc in _ray_docs(copy.deepcopy(rendered["gpu-prod"])):
        spec = _groups(doc)[-1]["template"]["spec"]
        plant(spec, spec["containers"][0])
        probs = pods.check_shm(doc)
        assert len(probs) == 1 and expect in probs[0], probs


def test_object_store_size_follows_rays_rules():
    container = {"resources": {"limits": {"memory": "10Gi"}}}
    assert pods.object_store_bytes({}, container) == pytest.approx(3 * 2**30)
    assert pods.object_store_bytes({"object-store-memory": "1000"}, container) == 1000


def test_shipped_gpu_groups_are_scheduled_by_the_gpu_request_alone(rendered):
    docs = _ray_docs(rendered["gpu-prod"])
    assert {n for d in docs for n, _ in pods.gpu_templates(d)} == {"gpu-workers", "gpu-serve"}
    for doc in docs:
        for _, template in pods.gpu_templates(doc):
            assert not pods.accelerator_pins(template)
            assert "nodeSelector" not in template["spec"]


@pytest.mark.parametrize("plant, expect", [
    (lambda t: t["spec"].update(nodeSelector={"cloud.google.com/gke-accelerator": "nvidia-l4"}),
     "pinned to one kind of accelerator by cloud.google.com/gke-accelerator"),
    (lambda t: t["spec"].update(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                                    "values": ["NVIDIA-L4"]}]}]}}}),
     "pinned to one kind of accelerator by nvidia.com/gpu.product"),
    (lambda t: t["spec"].pop("tolerations"), "no toleration of the nvidia.com/gpu taint"),
    (lambda t: t["spec"]["containers"][0]["resources"]["requests"].pop("nvidia.com/gpu"),
     "requests must equal its limits"),
], ids=["gke-pin", "affinity-pin", "no-toleration", "no-gpu-request"])
def test_planted_gpu_scheduling_errors_fail(rendered, plant, expect):
    for doc in _ray_docs(copy.deepcopy(rendered["gpu-prod"])):
        (_, template), = pods.gpu_templates(doc)
        plant(template)
        probs = pods.check_gpu_scheduling(doc)
        assert len(probs) == 1 and expect in probs[0], probs


def test_the_node_selector_components_are_h100_a100_and_l4():
    assert [c.name for c in COMPONENTS] == ["gpu-nodes-a100", "gpu-nodes-h100", "gpu-nodes-l4"]


@pytest.mark.parametrize("component", COMPONENTS, ids=[c.name for c in COMPONENTS])
def test_a_node_selector_component_selects_the_gpu_groups_only(component):
    docs = render_with_components(REPO / "k8s" / "overlays" / "gpu-prod", [component])
    assert pods.check_node_selector_component(docs, component.name) == []
    want = {"gpu-nodes-h100": "NVIDIA-H100-80GB-HBM3", "gpu-nodes-a100": "NVIDIA-A100-SXM4-80GB",
            "gpu-nodes-l4": "NVIDIA-L4"}[component.name]
    for doc in _ray_docs(docs):
        for _, template in pods.gpu_templates(doc):
            assert template["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": want}
        assert pods.check_gpu_scheduling(doc, user_patch=True) == []  # the user's own selector is allowed


def test_planted_component_that_pins_a_cpu_group_fails():
    docs = render_with_components(REPO / "k8s" / "overlays" / "gpu-prod", [COMPONENTS[0]])
    job = next(d for d in docs if d["kind"] == "RayJob")
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] = {
        "nvidia.com/gpu.product": "NVIDIA-L4"}
    probs = pods.check_node_selector_component(docs, "gpu-nodes-x")
    assert probs == ["RayJob/qrag-index group cpu-workers: gpu-nodes-x pins a CPU group to GPU nodes "
                     "(nvidia.com/gpu.product)"]
