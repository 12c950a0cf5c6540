"""The RayService's autoscaling as tools/validate_deploy checks it (tools/validate_deploy/autoscaling.py): KubeRay's
autoscaler options are written down, and the pods the worker groups may have at maxReplicas hold every replica
Serve may ask for at max_replicas (the reverse, pods Serve can never use, is a warning). The shipped overlays pass,
and a manifest that breaks each rule fails with its own line."""

from __future__ import annotations

import copy

import pytest
import yaml

from tools.validate_deploy import REPO, autoscaling
from tools.validate_deploy.cli import Report, main
from tools.validate_deploy.render import render_kustomization

OVERLAYS = REPO / "k8s" / "overlays"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render_kustomization(OVERLAYS / name) for name in ("cpu-dev", "gpu-prod")}


def _rayservice(rendered: dict, overlay: str) -> dict:
    return copy.deepcopy(next(doc for doc in rendered[overlay] if doc["kind"] == "RayService"))


def _cluster(doc: dict) -> dict:
    return doc["spec"]["rayClusterConfig"]


def _set_deployment(doc: dict, name: str, **changes) -> dict:
    config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    for deployment in config["applications"][0]["deployments"]:
        if deployment["name"] == name:
            for key, value in changes.items():
                if key == "max_replicas":
                    deployment["autoscaling_config"]["max_replicas"] = value
                else:
                    deployment.setdefault("ray_actor_options", {})[key] = value
    doc["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    return doc


@pytest.mark.parametrize("overlay", ["cpu-dev", "gpu-prod"])
def test_the_shipped_overlays_pass_without_warnings(rendered, overlay):
    assert autoscaling.check_rayservice(_rayservice(rendered, overlay)) == ([], [])
    options = _cluster(_rayservice(rendered, overlay))["autoscalerOptions"]
    assert (options["upscalingMode"], options["idleTimeoutSeconds"]) == ("Default", 300)


@pytest.mark.parametrize("options, expect", [
    ({"idleTimeoutSeconds": 300}, "autoscalerOptions.upscalingMode is None: set one of Default, Aggressive, "
                                  "Conservative"),
    ({"upscalingMode": "Fast", "idleTimeoutSeconds": 300}, "autoscalerOptions.upscalingMode is 'Fast'"),
    ({"upscalingMode": "Default"}, "autoscalerOptions.idleTimeoutSeconds is None: set the seconds an idle worker pod"),
    ({"upscalingMode": "Default", "idleTimeoutSeconds": "300"}, "autoscalerOptions.idleTimeoutSeconds is '300'"),
    ({"upscalingMode": "Default", "idleTimeoutSeconds": 0}, "autoscalerOptions.idleTimeoutSeconds is 0"),
])
def test_autoscaler_options_without_a_mode_or_an_idle_timeout_fail(rendered, options, expect):
    doc = _rayservice(rendered, "cpu-dev")
    _cluster(doc)["autoscalerOptions"] = {**options, "securityContext": {"runAsNonRoot": True}}
    problems, _ = autoscaling.check_rayservice(doc)
    assert len(problems) == 1 and problems[0].startswith(expect), problems


def test_too_few_worker_pods_for_serves_max_replicas_fail_naming_the_maxreplicas_that_would_do(rendered):
    doc = _rayservice(rendered, "cpu-dev")
    _cluster(doc)["workerGroupSpecs"][0]["maxReplicas"] = 4
    problems, warnings = autoscaling.check_rayservice(doc)
    # Router 8 x 2 CPUs, ShardSearcher0..3 4 x 4 x 2, Synthesizer 4 x 0.25, the Writer 1 x 1: 29 replicas, 50
    # CPUs; 4 pods of 8 CPUs hold 16 of the 2-CPU replicas
    assert problems == ["Serve's deployments at max_replicas ask for 29 CPU replicas (50 CPUs), the pods the worker "
                        "groups may have at maxReplicas hold 16 of them, so the autoscaler would leave 13 pending: "
                        "cpu-serve maxReplicas 7 would hold them all (or lower max_replicas)"]
    assert warnings == []


def test_a_head_with_cpus_takes_replicas_too(rendered):
    doc = _rayservice(rendered, "cpu-dev")
    _cluster(doc)["workerGroupSpecs"][0]["maxReplicas"] = 6
    assert autoscaling.check_rayservice(doc)[0], "6 pods of 8 CPUs cannot hold 50 CPUs"
    _cluster(doc)["headGroupSpec"]["rayStartParams"]["num-cpus"] = "2"
    assert autoscaling.check_rayservice(doc) == ([], [])


def test_gpu_replicas_go_to_gpu_pods_only(rendered):
    doc = _set_deployment(_rayservice(rendered, "gpu-prod"), "Synthesizer", num_gpus=1, max_replicas=6)
    problems, _ = autoscaling.check_rayservice(doc)
    assert problems == ["Serve's deployments at max_replicas ask for 6 GPU replicas (6 GPUs), the pods the worker "
                        "groups may have at maxReplicas hold 4 of them, so the autoscaler would leave 2 pending: "
                        "gpu-serve maxReplicas 6 would hold them all (or lower max_replicas)"]
    on_cpu_dev = _set_deployment(_rayservice(rendered, "cpu-dev"), "Synthesizer", num_gpus=1)
    assert autoscaling.check_rayservice(on_cpu_dev)[0] == [
        "Serve's deployments at max_replicas ask for 4 GPU replicas (4 GPUs), the pods the worker groups may have at "
        "maxReplicas hold 0 of them, so the autoscaler would leave 4 pending: no GPU worker group has a pod one of "
        "them fits in"]


def test_a_replica_bigger_than_any_pod_fails(rendered):
    doc = _set_deployment(_rayservice(rendered, "cpu-dev"), "Router", num_cpus=16, max_replicas=1)
    problems, _ = autoscaling.check_rayservice(doc)
    assert len(problems) == 1 and problems[0].endswith(
        "so the autoscaler would leave 1 pending: no CPU worker group has a pod one of them fits in"), problems


def test_worker_groups_far_beyond_what_serve_uses_warn_but_do_not_fail(rendered, capsys):
    doc = _rayservice(rendered, "gpu-prod")
    _cluster(doc)["workerGroupSpecs"][0]["maxReplicas"] = 32
    report = Report()
    autoscaling.validate(doc, report, "gpu-prod: RayService/qrag")
    assert report.ok
    assert capsys.readouterr().err.splitlines() == [
        "warning: gpu-prod: RayService/qrag: the CPU worker groups (cpu-serve maxReplicas 32) may hold 256 CPUs, "
        "Serve's deployments at max_replicas use at most 50 (about 7 pods): pods beyond those are never started "
        "for Serve"]
    _cluster(doc)["workerGroupSpecs"][0]["maxReplicas"] = 12  # 96 CPUs: under twice what Serve uses
    assert autoscaling.check_rayservice(doc) == ([], [])


def test_the_cli_fails_a_manifest_that_breaks_a_rule_with_one_line(rendered, tmp_path, capsys):
    docs = copy.deepcopy(rendered["cpu-dev"])
    rayservice = next(doc for doc in docs if doc["kind"] == "RayService")
    rayservice["spec"]["rayClusterConfig"]["autoscalerOptions"].pop("upscalingMode")
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main([str(path)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "autoscalerOptions" in line]
    assert errors == [f"error: {path}: RayService/qrag: autoscalerOptions.upscalingMode is None: set one of Default, "
                      "Aggressive, Conservative"]


def test_packing_is_first_fit_decreasing():
    node_type = {"resources": {"CPU": 8}, "max_workers": 1}
    three = [autoscaling.Replica("a", 3.0, 0.0)] * 3
    assert autoscaling.pods_needed(three, node_type) == 2  # 3 + 3 on one pod, the third on another
    assert autoscaling.pods_needed([autoscaling.Replica("a", 9.0, 0.0)], node_type) is None
    pods = autoscaling.pods_at_max({"headgroup": {"resources": {"CPU": 0}, "max_workers": 0}, "cpu": node_type})
    assert autoscaling.pack(three, pods) == [autoscaling.Replica("a", 3.0, 0.0)]
    config = {"applications": [{"deployments": [
        {"name": "fixed", "num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5}},
        {"name": "scaled", "autoscaling_config": {"min_replicas": 1, "max_replicas": 3}},
        {"name": "plain"}]}]}
    assert autoscaling.serve_replicas(config) == [autoscaling.Replica("fixed", 0.5, 0.0)] * 2 + [
        autoscaling.Replica("scaled", 1.0, 0.0)] * 3 + [autoscaling.Replica("plain", 1.0, 0.0)]
