"""The cpu-dev RayService rehearsed the way the cluster runs it (cluster/rehearse_service.py), run as an operator
runs it: a head without CPUs and two serving pods, each pod with its own address and ports, serveConfigV2
deployed through the head's dashboard with the cluster's token, and every pod's port 8000 asked from outside
its network. With the shipped environment HAProxy answers on every pod, the head's included, which holds no
replica: its answers come from Router replicas on the other pods. A document written through the head's port is
searchable on every pod (the data volume is writable, the Writer runs on a serving pod). Afterwards nothing of it
is left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import pod_network

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_the_cpu_dev_rayservice_serves_a_tenant_through_haproxy_on_every_pod():
    if why := pod_network.unavailable():
        pytest.skip(why)
    run = subprocess.run([sys.executable, "-m", "cluster.rehearse_service", "--overlay", "cpu-dev",
                          "--set", "local_search_max_bytes=0"],  # the tenant fans out to the ShardSearchers
                         cwd=REPO, capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["ok"] and not out["problems"]
    rows = {row["pod"]: row for row in out["pods"]}
    assert list(rows) == ["head", "cpu-serve-0", "cpu-serve-1"]
    for row in rows.values():
        assert (row["listener"], row["healthz"], row["search"], row["wrong_key"]) == ("haproxy", 200, 200, 401), row
        assert row["rank1"] == "break" and row["path"] == "shards", row
    # two Routers, four ShardSearchers, the Synthesizer and the Writer, none on the head
    assert out["replicas"]["head"] == 0 and out["replicas"]["cpu-serve-0"] + out["replicas"]["cpu-serve-1"] >= 8
    # a document written through the head's port is searchable, and found first on every pod
    assert out["write"]["status"] == "searchable", out["write"]
    assert out["write"]["rank1"] == dict.fromkeys(rows, "walrus"), out["write"]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"qrn{out['net']}-" not in left
    assert not Path(out["work"]).exists()
