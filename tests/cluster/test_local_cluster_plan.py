"""Pure parts of the local cluster script: ports, resources and the `ray start` command lines.

Why: the script must never touch another Ray on the box (default ports 6379/8265/10001/8000, the
default /tmp/ray temp dir) and must give each node its own resource so tests can place work.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cluster import local_cluster
from cluster import node_processes as procs

DEFAULT_RAY_PORTS = {6379, 8265, 10001, 8000, 8076, 8077, 52365, 44217}


def _state(base=27000, workers=2):
    return local_cluster.ClusterState(name="t", dir="/tmp/qrag-lc-t", base_port=base,
                                      address=f"{local_cluster.HOST}:{base}", dashboard_url="", client_port=base + 1,
                                      nodes=local_cluster.plan_nodes(base, workers, 2, 0))


def test_ports_are_distinct_and_avoid_ray_defaults():
    ports = local_cluster.ports_of(27000, 2)
    assert len(ports) == len(set(ports))
    assert not set(ports) & DEFAULT_RAY_PORTS


def test_every_node_has_its_own_resource_and_the_head_no_cpus():
    nodes = local_cluster.plan_nodes(27000, 2, 3, 0)
    assert [n.name for n in nodes] == ["head", "node_a", "node_b"]
    assert [n.resources for n in nodes] == [{"head": 1.0}, {"node_a": 1.0}, {"node_b": 1.0}]
    assert [n.num_cpus for n in nodes] == [0, 3, 3]


def test_ray_start_commands_use_own_ports_temp_dir_and_loopback():
    state = _state()
    for node in state.nodes:
        cmd = local_cluster.ray_start_command(state, node, 300)
        joined = " ".join(cmd)
        assert cmd[1] == "start" and "--temp-dir /tmp/qrag-lc-t/ray" in joined
        assert f"--node-ip-address {local_cluster.HOST}" in joined
        for flag in ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
                     "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
                     "--min-worker-port", "--max-worker-port"):
            assert flag in cmd, flag
            assert int(cmd[cmd.index(flag) + 1]) not in DEFAULT_RAY_PORTS
        if node.index == 0:
            assert "--head" in cmd and cmd[cmd.index("--port") + 1] == "27000"
            assert cmd[cmd.index("--dashboard-host") + 1] == local_cluster.HOST
        else:
            assert cmd[cmd.index("--address") + 1] == f"{local_cluster.HOST}:27000"


def test_env_marks_processes_and_turns_token_auth_on(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    env = local_cluster._env(Path("/tmp/qrag-lc-t"))
    assert env[procs.ENV_MARKER] == "/tmp/qrag-lc-t"
    assert "RAY_ADDRESS" not in env  # a driver's address must not redirect `ray start`
    assert env["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # an explicit choice of the caller is kept
    assert local_cluster._env(Path("/tmp/qrag-lc-t"))["RAY_AUTH_MODE"] == "disabled"


def test_temp_dir_is_short_enough_for_unix_sockets():
    # Ray puts sockets at <temp>/session_<date>_<pid>/sockets/plasma_store (~70 chars on top)
    assert len(str(local_cluster.default_dir("qrc-12345"))) + 70 < 107


def test_cluster_pids_finds_nothing_for_an_unknown_dir(tmp_path):
    assert procs.cluster_pids(tmp_path / "nope") == []


def test_a_ray_start_that_hangs_is_torn_down_and_tried_again(tmp_path, monkeypatch, capsys):
    """A `ray start` past its timeout (a loaded box) is a failed attempt: torn down, retried, then one
    error naming the log; never a TimeoutExpired out of `up`."""
    starts = []
    kills = []

    def hung(cmd, **options):
        starts.append(cmd)
        raise subprocess.TimeoutExpired(cmd, options["timeout"])

    monkeypatch.setattr(local_cluster.subprocess, "run", hung)
    monkeypatch.setattr(local_cluster, "kill_cluster_processes", lambda cdir: kills.append(cdir) or [])
    monkeypatch.setattr(local_cluster, "ensure_token", lambda env: None)
    with pytest.raises(RuntimeError, match=r"`ray start` for head did not return in 5s; see .*ray-start.log"):
        local_cluster.up("t", workers=0, cdir=tmp_path / "c", timeout=5, base_port=27000, quiet=True, attempts=2)
    assert len(starts) == 2 and len(kills) == 2 and "attempt 1/2" in capsys.readouterr().err
