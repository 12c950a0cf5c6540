"""Serving at scale, over real HTTP on a local Ray: tenant affinity (Serve's model multiplexing sends a
tenant's shard requests to the replicas that hold them) and autoscaling exercised by a load ramp.
Request deadlines are a minute here: a 2-core box running the suite is slow, not broken."""

from __future__ import annotations

import time

import httpx
import pytest

from qrag_ray.runtime.ports import free_port
from support.http_load import Load, wait_for

QUERY = {"query": "When does the else clause of a for loop run?", "k": 3}
SMALL = {"ray_actor_options": {"num_cpus": 0.25}}


@pytest.fixture(scope="module")
def serve_app(local_ray, tenant_indexes):
    """Serve on a port of this module's (an earlier module's Serve is shut down first); `deploy(name, args,
    options)` runs an app with tenants alpha and beta (3 shards each), every tenant fanned out to the
    ShardSearcher replicas, and returns (url, headers per tenant)."""
    from ray import serve

    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import add_tenant, set_admin_key

    serve.shutdown()
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})

    def deploy(name: str, args: dict, options: dict):
        tenants_file = tenant_indexes["workdir"] / f"{name}-tenants.yaml"
        keys = {t: add_tenant(tenants_file, t, tenant_indexes[t]) for t in ("alpha", "beta")}
        keys["admin"] = set_admin_key(tenants_file)
        serve.run(compose_app({"tenants": str(tenants_file), "local_search_max_bytes": 0, **args}, options),
                  name=name, route_prefix=f"/{name}")
        return f"http://127.0.0.1:{port}/{name}", {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}

    yield deploy
    serve.shutdown()


def _search(client, headers) -> dict:
    response = client.post("/v1/search", json=QUERY, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["timings"]


@pytest.mark.slow
def test_a_tenants_queries_stay_on_the_replicas_that_hold_it_and_another_tenant_goes_elsewhere(serve_app):
    from ray import serve

    # two replicas of every shard deployment, nothing loaded at start-up
    url, headers = serve_app("affine", {"warm_tenants": 0, "request_timeout_s": 60},
                             {"Router": SMALL, **{f"ShardSearcher{i}": {**SMALL, "num_replicas": 2} for i in range(3)}})
    with httpx.Client(base_url=url, timeout=120) as client:
        first = _search(client, headers["alpha"])
        assert first["path"] == "shards" and first["cold_loads"] == 3  # each shard read once, where it was sent
        alpha = first["shard_replicas"]
        time.sleep(1.0)  # replicas report what they hold every 0.1 s; Serve's routers learn it from the controller
        for _ in range(6):  # without affinity each shard's request would go to either replica
            again = _search(client, headers["alpha"])
            assert again["cold_loads"] == 0 and again["shard_replicas"] == alpha, again
        beta = _search(client, headers["beta"])  # a tenant nobody holds goes to the replica holding fewest
        assert beta["cold_loads"] == 3, (alpha, beta)
        assert all(b != a for a, b in zip(alpha, beta["shard_replicas"], strict=True)), (alpha, beta)
        time.sleep(1.0)
        for tenant, replicas in (("beta", beta["shard_replicas"]), ("alpha", alpha)):
            again = _search(client, headers[tenant])
            assert again["cold_loads"] == 0 and again["shard_replicas"] == replicas, (tenant, again)
    serve.delete("affine")


@pytest.mark.slow
def test_a_burst_of_cold_requests_for_one_tenant_loads_each_shard_once_and_all_answer(serve_app):
    """Sixteen requests at once for a tenant nobody has loaded: the Router's search batches and each
    replica's single load per shard mean three loads in all (one per shard: the replicas' own counts), and
    every request is a 200. A request's `cold_loads` counts the loads it waited for (its batch's, or one
    another batch started), so several requests may report the same load."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    url, headers = serve_app("burst", {"warm_tenants": 0, "request_timeout_s": 60},
                             {"Router": SMALL, **{f"ShardSearcher{i}": {**SMALL, "num_replicas": 1} for i in range(3)}})

    def one(i: int) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=120) as client:
            body = {**QUERY, "query": f"{QUERY['query']} ({i})"}
            return client.post("/v1/search", json=body, headers=headers["beta"])

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(16)))
    assert [r.status_code for r in got] == [200] * 16, [r.text for r in got if r.status_code != 200][:2]
    timings = [r.json()["timings"] for r in got]
    assert {t["path"] for t in timings} == {"shards"} and all(t["cold_loads"] <= 3 for t in timings), timings
    assert sum(t["cold_loads"] for t in timings) >= 3, timings  # the first requests waited for every shard
    with httpx.Client(base_url=url, timeout=120) as client:
        status = client.get("/v1/admin/status", headers=headers["admin"]).json()
    assert [(s["shard"], s["cold_loads"]) for s in status["shards"]] == [(0, 1), (1, 1), (2, 1)], status["shards"]
    serve.delete("burst")


@pytest.mark.slow
def test_grouped_shard_searchers_rank_as_in_process_with_one_call_per_group(serve_app, tenant_indexes, open_engine):
    """`shards_per_searcher: 2` over 3-shard tenants: ShardSearcher0 searches shards 0 and 1 in one call,
    ShardSearcher1 shard 2; the pages are the in-process engine's."""
    from ray import serve

    url, headers = serve_app("grouped", {"warm_tenants": 2, "request_timeout_s": 60, "shards_per_searcher": 2},
                             {"Router": SMALL, **{f"ShardSearcher{g}": {**SMALL, "num_replicas": 1} for g in range(2)}})
    deployments = set(serve.status().applications["grouped"].deployments)
    assert deployments == {"Router", "ShardSearcher0", "ShardSearcher1", "Writer"}  # one deployment per shard group
    engine = open_engine(tenant_indexes["alpha"])
    with httpx.Client(base_url=url, timeout=120) as client:
        for query in ("When does the else clause of a for loop run?", "What does the with statement do?"):
            for k in (3, 25):
                response = client.post("/v1/search", json={"query": query, "k": k}, headers=headers["alpha"])
                assert response.status_code == 200, response.text
                got = response.json()
                want = engine.search([query], k=k)[0]
                assert len(want) == k
                replicas = got["timings"]["shard_replicas"]
                assert got["timings"]["path"] == "shards" and len(replicas) == 3
                assert replicas[0] == replicas[1] != replicas[2]
                assert [x["chunk_id"] for x in got["results"]] == [x["chunk_id"] for x in want]
                assert [x["score"] for x in got["results"]] == pytest.approx([x["score"] for x in want], abs=1e-4)
    serve.delete("grouped")


@pytest.mark.slow
@pytest.mark.soak  # Serve's own policy; CI runs the big tenant's ramp (our ShardSearchers' policy) below
def test_a_load_ramp_scales_the_router_up_and_back_down_without_failing_a_request(serve_app):
    """The Router (the query embedding: the CPU a search costs) autoscales 1 -> 2 under concurrent
    searches and back to 1 under a trickle; the replica that stops drains its requests first, so no
    request fails at any point of the ramp."""
    from ray import serve

    # metrics every 0.5 s (Serve's default is 10 s, which would make the test wait): a deprecated field
    # that Ray 2.60 still honours
    ramp = {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
            "upscale_delay_s": 1, "downscale_delay_s": 4, "metrics_interval_s": 0.5, "look_back_period_s": 2}
    url, headers = serve_app("ramp", {"request_timeout_s": 60, "warm_tenants": 2},
                             {"Router": {**SMALL, "autoscaling_config": ramp},
                              **{f"ShardSearcher{i}": {**SMALL, "num_replicas": 1} for i in range(3)}})

    def replicas(state: str | None = None) -> int:
        deployment = serve.status().applications["ramp"].deployments["Router"]
        return sum(n for s, n in deployment.replica_states.items() if state is None or s == state)

    assert replicas("RUNNING") == 1
    responses = []
    heavy = Load(url, headers["alpha"], workers=6, body=QUERY, timeout=90)
    try:
        start = time.time()
        wait_for(lambda: replicas() >= 2, 60, "a second Router replica asked for under load")
        decided_s = time.time() - start
        wait_for(lambda: replicas("RUNNING") >= 2, 180, "the second Router replica running")
    finally:
        responses += heavy.finish()
    trickle = Load(url, headers["alpha"], workers=1, body=QUERY, timeout=90)
    try:
        wait_for(lambda: replicas() == 1, 120, "back to one Router replica under a trickle")
        time.sleep(2.0)  # requests keep going to the one replica left
    finally:
        responses += trickle.finish()
    bad = [r for r in responses if r["status"] != 200]
    assert decided_s < 30 and len(responses) > 20 and not bad, (decided_s, len(responses), bad[:3])
    serve.delete("ramp")


@pytest.mark.slow
def test_a_big_tenants_shard_searchers_follow_its_load_up_and_back_down(serve_app):
    """One tenant, two shard groups (`shards_per_searcher: 2` over 3 shards), each ShardSearcher 1..3 on qrag's
    policy with short delays: a trickle (one client) keeps one replica each, ten clients take each group to
    two or more within 30 s, and the trickle after brings them back to one within 30 s past the downscale
    delay; no request fails, and the added replicas answer without loading a shard for any request. The Router
    is fixed at one replica, so the ShardSearchers' own signal (the queries their passes carry) is what scales
    them. About two and a half minutes."""
    import threading

    from ray import serve

    from qrag_ray.serving.application import SHARD_SEARCHER_POLICY

    # a target well below one query per replica: the small test index is searched in a millisecond or two, so
    # a replica holds a query for a small share of a request (a trickle keeps 0.05-0.1 queries in a group's
    # replicas, ten clients 0.2-0.5, the Router's embedding most of the rest). Metrics every 0.5 s (the
    # deprecated field Ray 2.60 still honours).
    scaling = {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 0.15,
               "upscale_delay_s": 2, "downscale_delay_s": 6, "metrics_interval_s": 0.5, "look_back_period_s": 4,
               "policy": SHARD_SEARCHER_POLICY}
    groups = ("ShardSearcher0", "ShardSearcher1")
    url, headers = serve_app("bigramp", {"request_timeout_s": 60, "warm_tenants": 1, "shards_per_searcher": 2},
                             {"Router": {**SMALL, "num_replicas": 1},
                              **{group: {**SMALL, "autoscaling_config": scaling} for group in groups}})
    timeline: list[tuple[float, dict]] = []
    stop = threading.Event()
    started = time.time()

    def watch() -> None:
        while not stop.is_set():
            deployments = serve.status().applications["bigramp"].deployments
            timeline.append((time.time() - started, {group: deployments[group].replica_states.get("RUNNING", 0)
                                                     for group in groups}))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    responses = []
    try:
        trickle = Load(url, headers["alpha"], workers=1, body=QUERY, timeout=90)
        time.sleep(25)
        responses += trickle.finish()
        rise = time.time() - started
        heavy = Load(url, headers["alpha"], workers=10, body=QUERY, timeout=90)
        try:
            wait_for(lambda: timeline and all(n >= 2 for n in timeline[-1][1].values()), 60,
                     "two replicas of each ShardSearcher under load")
            time.sleep(5)  # the load keeps going to every replica
        finally:
            responses += heavy.finish()
        fall = time.time() - started
        trickle = Load(url, headers["alpha"], workers=1, body=QUERY, timeout=90)
        try:
            wait_for(lambda: all(n == 1 for n in timeline[-1][1].values()), 90, "back to one replica each")
        finally:
            responses += trickle.finish()
    finally:
        stop.set()
        watcher.join()
    first_stage = [counts for t, counts in timeline if t < rise]
    changes = sum(before != after for before, after in zip(first_stage, first_stage[1:], strict=False))
    up_s = next(t for t, counts in timeline if t >= rise and all(n >= 2 for n in counts.values())) - rise
    down_s = next(t for t, counts in timeline if t >= fall and all(n == 1 for n in counts.values())) - fall
    bad = [r for r in responses if r["status"] != 200]
    assert len(responses) > 100 and not bad, (len(responses), bad[:3])
    assert changes <= 1 and up_s < 30 and down_s - scaling["downscale_delay_s"] < 30, (changes, up_s, down_s, timeline)
    # the replicas added under load answered, and none made a request wait for its shards: a replica opens the
    # warm tenant's group before Serve routes to it
    timings = [(r["t0"] - started, r["body"]["timings"]) for r in responses]
    known = {replica for sent, got in timings if sent < rise for replica in got["shard_replicas"]}
    by_new = [got for _, got in timings if set(got["shard_replicas"]) - known]
    assert by_new, "no response named a replica added under load"
    assert all(got["cold_loads"] == 0 for got in by_new), [got for got in by_new if got["cold_loads"]][:3]
    serve.delete("bigramp")
