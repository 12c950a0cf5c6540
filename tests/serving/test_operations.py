"""Operating the Serve app while things change, over real HTTP: keys rotated and revoked, tenants with
any shard count, an index version swapped under load, shard replicas killed under load, rate limits.

Everything is real (local Ray, Serve, FAISS, MiniLM); changes are made the way an operator makes them
(`qrag tenants ...` functions rewriting the file, `qrag publish` moving a versioned root's pointer).
"""

from __future__ import annotations

import time

import httpx
import pytest

from qrag_ray.runtime.ports import free_port
from support.http_load import QUERY, Load, wait_for
from support.serving_data import ALPHA_TOPICS, BETA_TOPICS

RELOAD_S = 0.5


@pytest.fixture(scope="module")
def ops(local_ray, tenant_indexes, index_builder):
    """App `ops` at /ops: tenants with 1, 2 and 3 shards, a rate-limited one, a versioned root, and
    two replicas of every shard deployment; the tenants file is re-read every RELOAD_S."""
    from ray import serve

    from qrag_ray.index.versions import publish_version
    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import add_tenant, set_admin_key

    workdir = tenant_indexes["workdir"]
    one = index_builder(workdir, "one", ALPHA_TOPICS[:6], shards=1)
    two = index_builder(workdir, "two", BETA_TOPICS[:8], shards=2)
    root = workdir / "swap-root"
    publish_version(root, tenant_indexes["alpha"])
    tenants_file = workdir / "ops-tenants.yaml"
    keys = {"one": add_tenant(tenants_file, "one", one), "two": add_tenant(tenants_file, "two", two),
            "three": add_tenant(tenants_file, "three", tenant_indexes["beta"]),
            "rot": add_tenant(tenants_file, "rot", tenant_indexes["alpha"]),
            "limited": add_tenant(tenants_file, "limited", one, rate_limit={"rps": 0.5, "burst": 2}),
            "swap": add_tenant(tenants_file, "swap", root)}
    keys["admin"] = set_admin_key(tenants_file)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    small = {"ray_actor_options": {"num_cpus": 0.25}}
    options = {"Router": small, **{f"ShardSearcher{i}": {**small, "num_replicas": 2} for i in range(3)}}
    # every tenant fans out to the ShardSearcher replicas here (small ones are searched in the Router by default)
    args = {"tenants": str(tenants_file), "tenants_reload_s": RELOAD_S, "request_timeout_s": 20,
            "local_search_max_bytes": 0}
    serve.run(compose_app(args, options), name="ops", route_prefix="/ops")
    url = f"http://127.0.0.1:{port}/ops"
    client = httpx.Client(base_url=url, timeout=120)
    yield {"url": url, "client": client, "keys": keys, "tenants_file": tenants_file, "root": root,
           "one": one, "two": two, **tenant_indexes}
    client.close()
    serve.delete("ops")


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def status(ops) -> dict:
    return ops["client"].get("/v1/admin/status", headers=bearer(ops["keys"]["admin"])).json()


@pytest.mark.integration
def test_tenants_with_1_2_and_3_shards_are_all_healthy(ops):
    client = ops["client"]
    for name, shards, topics in (("one", 1, ALPHA_TOPICS[:6]), ("two", 2, BETA_TOPICS[:8]), ("three", 3, BETA_TOPICS)):
        headers = bearer(ops["keys"][name])
        response = client.post("/v1/search", json={"query": "How do loops end?", "k": 4}, headers=headers)
        assert response.status_code == 200, response.text
        assert len(response.json()["results"]) == 4 and {x["doc_id"] for x in response.json()["results"]} <= set(topics)
        assert response.json()["timings"]["path"] == "shards"
        index = client.get("/v1/indexes", headers=headers).json()["indexes"][0]
        assert index["num_shards"] == shards and index["available"]
    assert client.get("/healthz").json() == {"status": "ok"}
    admin_status = wait_for(lambda: (s := status(ops))["status"] == "ok" and s, 60, "admin status ok")
    by_name = {t["name"]: t for t in admin_status["tenants"]}
    assert {n: by_name[n]["num_shards"] for n in ("one", "two", "three")} == {"one": 1, "two": 2, "three": 3}
    assert all(t["status"] == "ok" and not t["problems"] for t in admin_status["tenants"]), admin_status
    assert {t["searched_in"] for t in admin_status["tenants"]} == {"shards"}
    assert admin_status["router_cache"]["loaded"] == 0


@pytest.mark.integration
def test_key_rotation_revocation_and_new_tenants_without_restart(ops):
    from qrag_ray.serving.tenants import add_tenant, remove_tenant, rotate_key

    client = ops["client"]
    tenants_file = ops["tenants_file"]
    keys = ops["keys"]
    old_key = keys["rot"]
    assert client.post("/v1/search", json=QUERY, headers=bearer(old_key)).status_code == 200
    rotated_at = time.time()
    rotated_key = rotate_key(tenants_file, "rot")
    wait_for(lambda: client.post("/v1/search", json=QUERY, headers=bearer(old_key)).status_code == 401, 10,
             "old key refused")
    assert time.time() - rotated_at < 10
    assert client.post("/v1/search", json=QUERY, headers=bearer(rotated_key)).status_code == 200
    # a new tenant, added while serving
    fresh = add_tenant(tenants_file, "fresh", ops["two"])

    def served_to_fresh():
        reply = client.post("/v1/search", json=QUERY, headers=bearer(fresh))
        return reply.status_code == 200 and reply

    response = wait_for(served_to_fresh, 10, "new tenant served")
    assert response.json()["results"]
    assert {x["doc_id"] for x in response.json()["results"]} <= set(BETA_TOPICS)
    # revoked: the tenant is gone
    remove_tenant(tenants_file, "rot")
    wait_for(lambda: client.post("/v1/search", json=QUERY, headers=bearer(rotated_key)).status_code == 401, 10,
             "removed tenant refused")
    # a broken file (an operator's typo) keeps the last good table and says so
    good = tenants_file.read_text()
    tenants_file.write_text("tenants: [this is: not valid")
    admin_status = wait_for(lambda: (s := status(ops))["registry"]["error"] and s, 10, "registry error reported")
    assert "kept the previous tenants table" in admin_status["registry"]["error"]
    assert client.post("/v1/search", json=QUERY, headers=bearer(fresh)).status_code == 200
    tenants_file.write_text(good)
    wait_for(lambda: status(ops)["registry"]["error"] is None, 10, "registry recovered")


@pytest.mark.integration
def test_rate_limit_answers_429_with_retry_after(ops):
    client = ops["client"]
    key = ops["keys"]["limited"]
    responses = [client.post("/v1/search", json=QUERY, headers=bearer(key)) for _ in range(4)]
    assert [r.status_code for r in responses[:2]] == [200, 200]
    limited = [r for r in responses[2:] if r.status_code == 429]
    assert limited, [r.status_code for r in responses]
    response = limited[0]
    assert response.json()["error"] == "rate_limited" and int(response.headers["retry-after"]) >= 1
    # other tenants are not slowed by it
    assert client.post("/v1/search", json=QUERY, headers=bearer(ops["keys"]["one"])).status_code == 200


@pytest.mark.integration
def test_index_version_swapped_under_load(ops):
    """alpha is served from a versioned root; beta is published over it while 4 clients search. No
    request fails, every response comes from one version (its chunks all belong to that corpus), and
    traffic moves to the new version."""
    from qrag_ray.index.format import load_manifest
    from qrag_ray.index.versions import publish_version

    old_version = load_manifest(ops["alpha"]).index_version
    new_version = load_manifest(ops["beta"]).index_version
    corpus = {old_version: set(ALPHA_TOPICS), new_version: set(BETA_TOPICS)}
    load = Load(ops["url"], bearer(ops["keys"]["swap"]))
    time.sleep(3)
    publish_version(ops["root"], ops["beta"])
    published_at = time.time()
    wait_for(lambda: any(r["body"].get("index_version") == new_version for r in load.responses), 60,
             "new version served")
    time.sleep(3)
    responses = load.finish()
    failed = [r for r in responses if r["status"] != 200]
    assert not failed, failed[:3]
    seen = {r["body"]["index_version"] for r in responses}
    assert seen == {old_version, new_version}
    for response in responses:
        docs = {x["doc_id"] for x in response["body"]["results"]}
        assert docs and docs <= corpus[response["body"]["index_version"]], (response["body"]["index_version"], docs)
    # once switched (one Router replica here), every request that starts afterwards is on the new version
    switched = min(r["t0"] + r["s"] for r in responses if r["body"]["index_version"] == new_version)
    late = [r for r in responses if r["t0"] > switched]
    assert late and all(r["body"]["index_version"] == new_version for r in late)
    assert switched - published_at < 60
    admin_status = status(ops)
    swap = next(t for t in admin_status["tenants"] if t["name"] == "swap")
    assert swap["serving_version"] == swap["current_version"] == new_version


def _replica_handles(app: str, deployment: str):
    import ray

    names = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"SERVE_REPLICA::{app}#{deployment}#")]
    return [ray.get_actor(a["name"], namespace=a["namespace"]) for a in names]


@pytest.mark.slow
@pytest.mark.soak
def test_shard_replica_killed_under_load_with_a_second_replica(ops):
    import ray

    replicas = _replica_handles("ops", "ShardSearcher0")
    assert len(replicas) == 2
    # the tenant loaded and the Router's encoder warm, whatever ran before this test
    assert ops["client"].post("/v1/search", json=QUERY, headers=bearer(ops["keys"]["three"])).status_code == 200
    load = Load(ops["url"], bearer(ops["keys"]["three"]))
    time.sleep(3)
    ray.kill(replicas[0], no_restart=True)
    time.sleep(8)
    responses = load.finish()
    failed = [r for r in responses if r["status"] != 200]
    assert len(responses) > 20
    assert not failed, failed[:3]


@pytest.mark.slow
@pytest.mark.soak
def test_single_shard_replica_killed_gives_clean_errors_never_a_hang(ops, tenant_indexes):
    """With one replica per shard there is nothing to fail over to: requests get 200 or a JSON
    503/504 within the deadline while Serve replaces the replica, then 200 again."""
    import ray
    from ray import serve

    from qrag_ray.serving.application import compose_app

    small = {"ray_actor_options": {"num_cpus": 0.25}}
    options = {"Router": small, **{f"ShardSearcher{i}": {**small, "num_replicas": 1} for i in range(3)}}
    deadline_s = 4.0
    app_args = {"index": str(tenant_indexes["alpha"]), "request_timeout_s": deadline_s, "local_search_max_bytes": 0}
    serve.run(compose_app(app_args, options), name="solo", route_prefix="/solo")
    url = ops["url"].removesuffix("/ops") + "/solo"  # the same Serve proxy
    try:
        wait_for(lambda: httpx.post(f"{url}/v1/search", json=QUERY, timeout=60).status_code == 200, 120,
                 "warm (the model and shards load in the background at start)")
        load = Load(url, {}, workers=3, timeout=deadline_s + 30)
        time.sleep(2)
        ray.kill(_replica_handles("solo", "ShardSearcher1")[0], no_restart=True)
        time.sleep(10)
        responses = load.finish()
        assert responses
        assert {r["status"] for r in responses} <= {200, 503, 504}, {r["status"] for r in responses}
        assert max(r["s"] for r in responses) < deadline_s + 10  # answered, never hung
        for response in responses:
            if response["status"] != 200:
                clean_errors = ("shard_unavailable", "deadline_exceeded", "overloaded")
                assert response["body"]["error"] in clean_errors, response["body"]
                assert response["body"]["message"]
        wait_for(lambda: httpx.post(f"{url}/v1/search", json=QUERY, timeout=60).status_code == 200, 120,
                 "served again after Serve replaced the replica")
    finally:
        serve.delete("solo")


@pytest.mark.slow
@pytest.mark.soak
def test_a_thousand_tenants_start_and_serve(ops, index_builder):
    """1,000 tenants, each with its own tiny index directory (one of them a different corpus), in one
    tenants file: the app starts, any tenant answers from its own index, the admin status lists all."""
    import random
    import shutil

    import yaml
    from ray import serve

    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import hash_key, new_key

    workdir = ops["workdir"] / "many"
    workdir.mkdir(exist_ok=True)
    tiny = index_builder(workdir, "tiny", ["for", "while"], shards=1)
    n = 1000
    keys = {}
    entries = []
    for i in range(n):
        index_dir = workdir / f"t{i:04d}"
        if not index_dir.exists():
            shutil.copytree(ops["two"] if i == 500 else tiny, index_dir)
        keys[i] = new_key()
        entries.append({"name": f"t{i:04d}", "index": str(index_dir), "key_sha256": hash_key(keys[i])})
    admin = new_key()
    tenants_file = workdir / "tenants.yaml"
    tenants_file.write_text(yaml.safe_dump({"admin_key_sha256": hash_key(admin), "tenants": entries}))
    small = {"ray_actor_options": {"num_cpus": 0.25}}
    options = {"Router": small, "ShardSearcher0": small, "ShardSearcher1": small}
    start = time.time()
    serve.run(compose_app({"tenants": str(tenants_file)}, options), name="many", route_prefix="/many")
    startup_s = time.time() - start
    url = ops["url"].removesuffix("/ops") + "/many"
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in [500] + random.Random(0).sample(range(n), 20):
                response = client.post("/v1/search", json=QUERY, headers=bearer(keys[i]))
                assert response.status_code == 200, (i, response.text)
                docs = {x["doc_id"] for x in response.json()["results"]}
                assert docs and docs <= (set(BETA_TOPICS[:8]) if i == 500 else {"for", "while"}), (i, docs)
            admin_status = client.get("/v1/admin/status", headers=bearer(admin)).json()
            assert len(admin_status["tenants"]) == n and all(t["status"] == "ok" for t in admin_status["tenants"])
            assert admin_status["router_cache"]["loaded"] >= 21  # small tenants are searched together in the Router
            assert {t["searched_in"] for t in admin_status["tenants"]} == {"router"}
        assert startup_s < 300
    finally:
        serve.delete("many")
