"""Nodes follow replicas (cluster/rehearse_autoscaler.py, its plan in cluster/autoscaler_plan.py, what it sees in
cluster/autoscaler_watch.py): the cpu-dev RayService's autoscaler config as KubeRay derives it, run by Ray's real
autoscaler with its fake multi-node provider on this machine. The plan, the log reading and the verdict are unit
tests; the rehearsal itself is slow: a head that holds the Router and one ShardSearcher replica, a closed-loop HTTP
load that makes Serve ask for a second replica, the autoscaler adding a cpu-serve node for it, and removing the node
after the idle timeout once the load is down to a trickle. It costs about two and a half minutes on 2 cores (most of
it the tenant index build, the app's start and the idle timeout) and at most ~3 GiB of memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster.autoscaler_plan import FAKE_PROVIDER, HEAD_NODE_ID, HEAD_TYPE, SEARCHER, AutoscalerPlan, head_env, plan
from cluster.autoscaler_watch import (
    IDLE_SLACK_S,
    Answer,
    Timeline,
    autoscaler_events,
    seconds_of,
    serve_decisions,
    verdict,
)
from cluster.node_processes import cluster_pids
from tools.validate_deploy.autoscaling import kuberay_autoscaling_config
from tools.validate_deploy.render import render_kustomization

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "k8s" / "overlays"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render_kustomization(OVERLAYS / name) for name in ("cpu-dev", "gpu-prod")}


def _plan(docs: list[dict], **kwargs) -> AutoscalerPlan:
    return plan(docs, "cpu-dev", tenants="/w/tenants.yaml", shards=1, http_port=18123,
                gcs_address="127.0.0.1:27000", idle_timeout_s=15.0, **kwargs)


def _rayservice(docs: list[dict]) -> dict:
    return next(doc for doc in docs if doc["kind"] == "RayService")


# ---------------------------------------------------------------- the plan


def test_the_autoscaler_config_is_kuberays_with_the_fake_provider_and_the_head_of_one_router_and_one_searcher(rendered):
    rehearsal = _plan(rendered["cpu-dev"])
    config = rehearsal.autoscaling
    kuberay = kuberay_autoscaling_config(_rayservice(rendered["cpu-dev"]))
    group = _rayservice(rendered["cpu-dev"])["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert rehearsal.group == "cpu-serve" and rehearsal.version == "v2"
    assert config["provider"]["type"] == "external" and config["provider"]["module"] == FAKE_PROVIDER
    assert config["provider"]["gcs_address"] == "127.0.0.1:27000" and config["provider"]["launch_multiple"] is True
    assert config["head_node_type"] == HEAD_TYPE
    assert config["available_node_types"][HEAD_TYPE]["resources"] == {"CPU": 5, "head": 1.0}  # + the Writer
    worker = config["available_node_types"]["cpu-serve"]
    assert worker["min_workers"] == 0 and worker["max_workers"] == group["maxReplicas"] == 7
    assert worker["resources"]["CPU"] == 8 and "memory" not in worker["resources"]
    assert config["upscaling_speed"] == kuberay["upscaling_speed"]  # KubeRay's reading of upscalingMode
    assert config["idle_timeout_minutes"] == 0.25 and config["max_workers"] == 7
    assert (rehearsal.head_cpus, rehearsal.searcher_cpus, rehearsal.worker_cpus) == (5, 2.0, 8.0)  # + the Writer


def test_the_serve_config_is_the_manifests_with_one_router_one_scaling_searcher_and_the_proxy_on_the_head(rendered):
    from ray.serve.schema import ServeDeploySchema

    shipped = yaml.safe_load(_rayservice(rendered["cpu-dev"])["spec"]["serveConfigV2"])
    config = _plan(rendered["cpu-dev"]).serve_config
    ServeDeploySchema.model_validate(config)
    assert config["proxy_location"] == "HeadOnly" and config["http_options"]["port"] == 18123
    app = config["applications"][0]
    assert app["import_path"] == shipped["applications"][0]["import_path"]
    assert "generator" not in app["args"] and app["args"]["local_search_max_bytes"] == 0
    args = app["args"]
    assert (args["tenants"], args["shards"], args["shards_per_searcher"]) == ("/w/tenants.yaml", 1, 1)
    router, searcher, writer = app["deployments"]
    assert writer == shipped["applications"][0]["deployments"][-1] and writer["name"] == "Writer"
    assert router["name"] == "Router" and router["num_replicas"] == 1 and "autoscaling_config" not in router
    assert searcher["name"] == SEARCHER and searcher["autoscaling_config"]["max_replicas"] == 2
    assert searcher["ray_actor_options"] == shipped["applications"][0]["deployments"][1]["ray_actor_options"]
    assert searcher["max_ongoing_requests"] == shipped["applications"][0]["deployments"][1]["max_ongoing_requests"]


def test_gpu_prod_keeps_its_groups_bounds_and_a_group_can_be_chosen(rendered):
    rehearsal = _plan(rendered["gpu-prod"], group="gpu-serve", version="v1")
    types = rehearsal.autoscaling["available_node_types"]
    assert types["cpu-serve"]["max_workers"] == 7 and types["gpu-serve"]["max_workers"] == 4
    assert types["gpu-serve"]["resources"]["GPU"] == 1 and rehearsal.group == "gpu-serve"
    assert "launch_multiple" not in rehearsal.autoscaling["provider"]
    assert head_env("v1")["RAY_enable_autoscaler_v2"] == "0"


def test_a_plan_that_cannot_be_rehearsed_is_refused_with_a_reason(rendered):
    with pytest.raises(ValueError, match="no worker group 'nope'"):
        _plan(rendered["cpu-dev"], group="nope")
    docs = json.loads(json.dumps(rendered["cpu-dev"]))
    group = _rayservice(docs)["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1"
    with pytest.raises(ValueError, match="a cpu-serve pod has 1 CPUs, a ShardSearcher replica needs 2"):
        _plan(docs)


# ---------------------------------------------------------------- the autoscaler's log and the verdict

MONITOR_LOG = """\
2026-12-04 21:00:36,768\tINFO event_logger.py:77 -- Adding 1 node(s) of type cpu-serve.
2026-12-04 21:00:36,769\tINFO event_logger.py:109 -- Resized to 12 CPUs.
2026-12-04 21:01:22,140\tINFO monitor.py:440 -- :event_summary:Removing 1 nodes of type cpu-serve (idle).
2026-12-04 21:01:22,141\tINFO autoscaler.py:1 -- Adding nothing here
"""


def test_the_autoscalers_launches_and_removals_are_read_with_their_times():
    events = autoscaler_events(MONITOR_LOG)
    assert [(event["action"], event["count"], event["node_type"], event["reason"]) for event in events] == [
        ("adding", 1, "cpu-serve", None), ("removing", 1, "cpu-serve", "idle")]
    assert round(events[1]["time"] - events[0]["time"], 3) == 45.372


CONTROLLER_LOG = """\
INFO 2026-12-04 21:00:12,709 controller 1259 -- Adding 1 replica to Deployment(name='ShardSearcher0', app='qrag').
INFO 2026-12-04 21:00:35,668 controller 1259 -- Upscaling Deployment(name='ShardSearcher0', app='qrag') from 1 to 2 \
replicas. Current ongoing requests: 0.47, current running replicas: 1.
INFO 2026-12-04 21:00:36,001 controller 1259 -- Upscaling Deployment(name='Router', app='qrag') from 1 to 2 replicas.
INFO 2026-12-04 21:01:04,651 controller 1259 -- Downscaling Deployment(name='ShardSearcher0', app='qrag') from 2 to 1 \
replicas. Current ongoing requests: 0.00, current running replicas: 2.
"""


def test_serves_scaling_decisions_are_read_per_deployment_with_their_times():
    decisions = serve_decisions(CONTROLLER_LOG, SEARCHER)
    assert [(decision["action"], decision["from"], decision["to"]) for decision in decisions] == [
        ("upscaling", 1, 2), ("downscaling", 2, 1)]
    assert round(decisions[1]["time"] - decisions[0]["time"], 3) == 28.983
    assert [decision["to"] for decision in serve_decisions(CONTROLLER_LOG, "Router")] == [2]


def _clean_run(rehearsal: AutoscalerPlan):
    events = autoscaler_events(MONITOR_LOG)
    timeline = Timeline(load_started=events[0]["time"] - 17, serve_asked=events[0]["time"] - 1,
                        node_joined=events[0]["time"] + 3, replica_ready=events[0]["time"] + 8,
                        load_dropped=events[0]["time"] + 13, replica_stopped=events[1]["time"] - 16,
                        node_removed=events[1]["time"] + 0.5, node_id=HEAD_NODE_ID[:-1] + "1")
    answers = [Answer(events[0]["time"], 0.05, "busy", 200, "break")] * 30
    answers += [Answer(events[1]["time"], 0.05, "trickle", 200, "break")] * 10
    initial = [{"deployment": "Router", "state": "RUNNING", "node_id": HEAD_NODE_ID},
               {"deployment": SEARCHER, "state": "RUNNING", "node_id": HEAD_NODE_ID},
               {"deployment": "Writer", "state": "RUNNING", "node_id": HEAD_NODE_ID}]
    return timeline, events, answers, initial


def test_a_clean_run_passes_and_each_fault_is_named(rendered):
    rehearsal = _plan(rendered["cpu-dev"])
    timeline, events, answers, initial = _clean_run(rehearsal)
    assert verdict(rehearsal, timeline, events, answers, initial) == []
    seconds = seconds_of(timeline, events)
    assert (seconds["launch_logged"], seconds["node_launch"], seconds["replica_start"], seconds["idle"]) == (
        17.0, 4.0, 5.0, 16.5)

    failed = answers + [Answer(timeline.node_joined, 10.0, "busy", 504, None, "deadline_exceeded")]
    assert verdict(rehearsal, timeline, events, failed, initial) == [
        "1 of 41 searches failed: busy HTTP 504 rank 1 None deadline_exceeded"]
    assert verdict(rehearsal, timeline, events[1:], answers, initial) == [
        "the autoscaler logged no launch of a cpu-serve node"]
    early = Timeline(**{**timeline.__dict__, "replica_stopped": timeline.node_removed - 5})
    assert verdict(rehearsal, early, events, answers, initial) == [
        "the node went 5.0s after its replica stopped, before the idle timeout (15s)"]
    late_ask = Timeline(**{**timeline.__dict__, "serve_asked": events[0]["time"] + 5})
    assert verdict(rehearsal, late_ask, events, answers, initial) == [
        "the autoscaler launched the node before Serve asked for the replica"]
    never = Timeline(**{**timeline.__dict__, "serve_asked": None, "replica_ready": None, "node_removed": None})
    assert verdict(rehearsal, never, events, answers[:3], initial[:1]) == [
        "before the load the head held ['Router'], not one Router, one ShardSearcher0 and the Writer replica",
        "Serve's controller logged no upscale of ShardSearcher0 under the load",
        "no ShardSearcher0 replica ran on an added node", "the added node was not removed",
        "too little load to show anything: 3 busy and 0 trickle searches"]


# ---------------------------------------------------------------- the rehearsal


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_replica_that_does_not_fit_starts_a_node_which_goes_when_idle():
    run = subprocess.run([sys.executable, "-m", "cluster.rehearse_autoscaler", "--overlay", "cpu-dev"],
                         cwd=REPO, capture_output=True, text=True, timeout=560)
    assert run.stdout.strip(), run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and out["ok"], (out["problems"], run.stderr[-4000:])
    assert (out["group"], out["autoscaler"]) == ("cpu-serve", "v2")
    assert [(event["action"], event["node_type"], event["reason"]) for event in out["events"]] == [
        ("adding", "cpu-serve", None), ("removing", "cpu-serve", "idle")]
    assert out["node_id"] and out["node_id"] != HEAD_NODE_ID
    requests = out["requests"]
    assert requests["failed"] == 0 and requests["busy"] >= 20 and requests["trickle"] >= 5, requests
    seconds = out["seconds"]
    assert seconds["serve_asked"] <= seconds["launch_logged"] + 1.0, seconds  # two logs, one clock
    assert seconds["launch_logged"] <= seconds["node_joined"] < seconds["replica_ready"], seconds
    assert seconds["idle"] >= out["idle_timeout_s"] - IDLE_SLACK_S, seconds
    assert not cluster_pids(Path(out["cluster_dir"])) and not Path(out["cluster_dir"]).exists()
    assert not Path(out["work"]).exists()
