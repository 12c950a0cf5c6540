"""Pure parts of the serving rehearsal (cluster/rehearse_service.py, cluster/pod_network.py): the rendered
RayService read as its pods and serve config, each pod's own network, the nodes started in it, and what
counts as a pod serving as the manifest means. The rehearsal itself runs in test_local_cluster.py."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from cluster import local_cluster, pod_network
from cluster.pod_layout import service_plan
from cluster.rehearse_service import QUERY, verdict
from qrag_ray.serving.config import CLUSTER_INGRESS_ENV, SERVE_PROCESS_ENV
from tools.validate_deploy.render import render_kustomization

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


@pytest.fixture(scope="module")
def cpu_dev():
    return service_plan(render_kustomization(REPO / "k8s" / "overlays" / "cpu-dev"))


def test_cpu_dev_rayservice_is_a_head_and_two_serving_pods_each_with_haproxy(cpu_dev):
    pods, config = cpu_dev
    assert [(p.name, p.num_cpus, p.memory // GiB) for p in pods] == [("head", 0, 8), ("cpu-serve-0", 8, 32),
                                                                     ("cpu-serve-1", 8, 32)]
    for pod in pods:  # what Serve reads when each of the pod's Ray processes starts
        assert {k: pod.env.get(k) for k in {**SERVE_PROCESS_ENV, **CLUSTER_INGRESS_ENV}} == \
            {**SERVE_PROCESS_ENV, **CLUSTER_INGRESS_ENV}
        assert "/tmp" in {m.path for m in pod.mounts}  # HAProxy's files: Ray's default folder is on /tmp
    assert config["http_options"]["port"] == 8000 and config["proxy_location"] == "EveryNode"
    assert config["applications"][0]["import_path"] == "qrag_ray.serving.application:build_app"


def test_every_pod_writes_the_data_volume_and_reads_the_secret_and_its_home_only(cpu_dev, tmp_path):
    """The write routes log into the tenants' roots on the claim (the RayService mounts it read-write), and a
    mount the manifest makes read-only is read-only in the rehearsal's pods too."""
    from dataclasses import replace

    from cluster.rehearse import lay_out_pod

    pods, _ = cpu_dev
    for pod in pods:
        paths, readonly = lay_out_pod(pod, tmp_path)
        assert str(paths["/mnt/qrag"]) not in readonly and str(paths["/etc/qrag/tenants"]) in readonly
        assert str(paths["/home/ray"]) in readonly
        locked = replace(pod, mounts=tuple(replace(m, read_only=True) if m.path == "/mnt/qrag" else m
                                           for m in pod.mounts))
        assert str(paths["/mnt/qrag"]) in lay_out_pod(locked, tmp_path)[1]


def test_service_plan_takes_pods_per_group_and_names_a_missing_service(cpu_dev):
    docs = render_kustomization(REPO / "k8s" / "overlays" / "cpu-dev")
    pods, _ = service_plan(docs, {"cpu-serve": 1})
    assert [p.name for p in pods] == ["head", "cpu-serve-0"]
    with pytest.raises(ValueError, match="no worker group"):
        service_plan(docs, {"gpu-serve": 1})  # cpu-dev removes the GPU group
    with pytest.raises(ValueError, match="no RayService"):
        service_plan(docs, name="other")


def test_pod_network_gives_each_pod_its_own_namespace_and_address():
    net = pod_network.PodNetwork("007", "10.231.7", 3)
    cmds = [" ".join(c) for c in net.setup_commands()]
    assert [net.ip(i) for i in range(3)] == ["10.231.7.10", "10.231.7.11", "10.231.7.12"]
    assert len({net.netns(i) for i in range(3)}) == 3
    for i in range(3):
        assert f"ip netns add {net.netns(i)}" in cmds
        assert f"ip -n {net.netns(i)} addr add {net.ip(i)}/24 dev eth0" in cmds
        assert f"ip -n {net.netns(i)} route add default via 10.231.7.1" in cmds
    links = [c[3] for c in net.setup_commands() if c[:3] == ["ip", "link", "add"]]
    assert len(links) == 4 and all(len(name) <= 15 for name in links)  # the bridge and 3 veths: at most 15 chars
    down = [" ".join(c) for c in net.teardown_commands()]
    assert down[-1] == f"ip link del {net.bridge}" and len(down) == 4


def test_pod_network_plan_avoids_this_machines_networks(monkeypatch):
    monkeypatch.setattr(pod_network, "used_networks",
                        lambda: [ipaddress.ip_network("10.200.0.0/16"), ipaddress.ip_network("10.201.5.0/24")])
    net = pod_network.plan(2, tag=5)
    assert net.subnet == "10.202.5" and net.tag == "005"
    assert pod_network.plan(2, tag=6).subnet == "10.201.6"


def test_a_node_in_a_pod_network_starts_there_on_its_address():
    shapes = [local_cluster.NodeShape("head", 0, ip="10.231.7.10", netns=["ip", "netns", "exec", "qrn007-0"]),
              local_cluster.NodeShape("w", 2, ip="10.231.7.11", netns=["ip", "netns", "exec", "qrn007-1"])]
    nodes = local_cluster.plan_nodes(27000, 0, 0, 0, shapes)
    state = local_cluster.ClusterState(name="t", dir="/tmp/qrag-lc-t", base_port=27000, address="10.231.7.10:27000",
                                       dashboard_url="", client_port=27001, nodes=nodes)
    head, worker = (local_cluster.ray_start_command(state, n, 300) for n in state.nodes)
    assert head[:4] == ["ip", "netns", "exec", "qrn007-0"] and worker[3] == "qrn007-1"
    assert head[head.index("--node-ip-address") + 1] == "10.231.7.10"
    assert head[head.index("--dashboard-host") + 1] == "10.231.7.10"
    assert worker[worker.index("--address") + 1] == "10.231.7.10:27000"
    assert state.metrics_urls[1].startswith("http://10.231.7.11:")


def _row(**options):
    row = {"pod": "cpu-serve-0", "listener": "haproxy", "expected": "haproxy", "healthz": 200, "search": 200,
           "rank1": QUERY[1], "wrong_key": 401, "error": None}
    return row | options


def test_verdict_names_each_way_a_pod_can_serve_other_than_meant():
    assert verdict(_row()) == []
    assert "port 8000 is ray::ProxyActor" in verdict(_row(listener="ray::ProxyActor"))[0]
    assert "healthz" in verdict(_row(healthz=503))[0]
    assert "rank 1 'pass'" in verdict(_row(rank1="pass"))[0]
    assert "HTTP 500" in verdict(_row(search=500, rank1=None))[0]
    assert "not 401" in verdict(_row(wrong_key=200))[0]


def test_without_pod_networks_the_rehearsal_says_why_in_one_line(monkeypatch, capsys):
    from cluster import rehearse_service

    monkeypatch.setattr(pod_network, "unavailable", lambda: "pod networks need root (network namespaces)")
    assert rehearse_service.main(["--overlay", "cpu-dev"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: pod networks need root (network namespaces); the serving rehearsal gives every pod its own network"]


def test_replicas_per_pod_counts_running_replicas_by_the_pods_addresses(cpu_dev, tmp_path):
    from cluster import rehearse_service

    pods, config = cpu_dev
    net = pod_network.PodNetwork("007", "10.231.7", len(pods))
    rehearsal = rehearse_service.ServiceRehearsal("cpu-dev", pods, tmp_path, net, "t", [], config, {})
    status = {"applications": {"qrag": {"deployments": {
        "Router": {"replicas": [{"state": "RUNNING", "node_ip": "10.231.7.11"},
                                {"state": "RUNNING", "node_ip": "10.231.7.12"}]},
        "ShardSearcher0": {"replicas": [{"state": "STARTING", "node_ip": "10.231.7.12"},
                                        {"state": "RUNNING", "node_ip": "10.231.7.11"}]}}}}}
    assert rehearse_service.replicas_per_pod(rehearsal, status) == {"head": 0, "cpu-serve-0": 2, "cpu-serve-1": 1}
