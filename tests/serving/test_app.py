"""The Serve app over HTTP: a real local Ray, real Serve, real 3-shard FAISS indexes, real MiniLM.

One module so Serve starts once (fixtures in conftest.py); the only fake is the OpenAI-compatible LLM.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from qrag_ray.index.format import load_manifest
from support.serving_data import ALPHA_TOPICS, BETA_TOPICS, HYDE_PASSAGE, IDK_MARKER

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS or Serve

QUERIES = [
    "When does the else clause of a for loop run?",
    "How are integers compared with floats?",
    "What does the global statement do?",
]


def auth(served, tenant):
    return {"Authorization": f"Bearer {served['keys'][tenant]}"}


def search(served, body, tenant="alpha", prefix=""):
    return served["client"].post(f"{prefix}/v1/search", json=body, headers=auth(served, tenant) if tenant else {})


# ------------------------------------------------------------------------------------ health, docs
def test_open_app_is_healthy_and_documents_its_api(served):
    client = served["client"]
    response = client.get("/open/healthz")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok"}
    spec = client.get("/open/openapi.json").json()
    assert {"/v1/search", "/v1/answer", "/v1/indexes", "/healthz", "/readyz", "/v1/admin/status"} <= set(spec["paths"])
    assert client.get("/open/docs").status_code == 200
    # the open (127.0.0.1) server shows its status to anyone who can reach it
    status = client.get("/open/v1/admin/status").json()
    assert status["status"] == "ok" and [t["name"] for t in status["tenants"]] == ["default"]


def test_liveness_tells_nothing_and_admin_status_needs_the_admin_key(served):
    client = served["client"]
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}  # no tenant names, paths or errors
    deadline = time.time() + 120
    while (response := client.get("/readyz")).status_code == 503 and time.time() < deadline:
        assert response.json() == {"status": "starting"}
        time.sleep(1)
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert client.get("/v1/admin/status").status_code == 401
    response = client.get("/v1/admin/status", headers=auth(served, "alpha"))  # a tenant's key is not the admin's
    assert response.status_code == 401 and response.json()["error"] == "unauthorized"


def test_broken_shard_is_reported_to_the_admin_and_the_others_keep_working(served):
    deadline = time.time() + 120  # the router loads the first tenants on every shard in the background
    while True:
        body = served["client"].get("/v1/admin/status", headers=auth(served, "admin")).json()
        by_name = {t["name"]: t for t in body["tenants"]}
        if by_name["gamma"]["problems"] or time.time() > deadline:
            break
        time.sleep(1)
    assert body["status"] == "degraded"
    bad = by_name["gamma"]
    assert bad["status"] == "error", bad
    assert any(p.startswith("shard 1:") and "checksum" in p.lower() for p in bad["problems"]), bad
    for name in ("alpha", "beta", "delta"):
        assert by_name[name]["status"] == "ok" and by_name[name]["current_version"], by_name[name]
    assert [s["shard"] for s in body["shards"]] == [0, 1, 2] and all(s["reachable"] for s in body["shards"])
    assert by_name["alpha"]["searched_in"] == "router"  # a small index: no shard hop
    # the broken tenant gets a clear 503, the others keep working
    response = search(served, {"query": "for loop", "k": 3}, tenant="gamma")
    assert response.status_code == 503 and response.json()["error"] == "index_unavailable"
    assert search(served, {"query": "for loop", "k": 3}).status_code == 200


# ------------------------------------------------------------------------------------ ranking
@pytest.mark.parametrize("k", [1, 5, 20, 40])
def test_returns_k_distinct_chunks(served, k):
    response = search(served, {"query": QUERIES[0], "k": k})
    assert response.status_code == 200, response.text
    body = response.json()
    ids = [x["chunk_id"] for x in body["results"]]
    assert len(ids) == k and len(set(ids)) == k
    scores = [x["score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True)
    for result in body["results"]:
        assert result["matched"] and result["text"] and result["doc_id"] in ALPHA_TOPICS
        assert result["score"] == pytest.approx(result["matched"][0]["score"], abs=1e-6)  # chunk score = best vector
    assert body["index_version"] and body["took_ms"] > 0


def test_k_beyond_the_index_returns_every_chunk_once(served):
    n = load_manifest(served["alpha"]).data["counts"]["chunks"]
    assert n < 100
    body = search(served, {"query": QUERIES[2], "k": 100}).json()
    ids = [x["chunk_id"] for x in body["results"]]
    assert len(ids) == n == len(set(ids))
    assert body["timings"]["rounds"] >= 1


@pytest.mark.parametrize("prefix,tenant", [("/open", None), ("", "alpha")])
def test_results_equal_in_process_search(served, prefix, tenant, open_engine):
    engine = open_engine(served["alpha"])
    for query in QUERIES:
        for k in (3, 25):
            want = engine.search([query], k=k)[0]
            got = search(served, {"query": query, "k": k}, tenant=tenant, prefix=prefix).json()
            assert got["index_version"] == engine.manifest.index_version
            # a lone request: a batch of one
            assert (got["timings"]["path"], got["timings"]["embed_batch"]) == ("router", 1)
            assert len(want) == k
            assert [x["chunk_id"] for x in got["results"]] == [x["chunk_id"] for x in want]
            for got_result, want_result in zip(got["results"], want, strict=True):
                assert got_result["score"] == pytest.approx(want_result["score"], abs=1e-4)
                got_matched = [(m["kind"], m["text"]) for m in got_result["matched"]]
                assert got_matched == [(m["kind"], m["text"]) for m in want_result["matched"]]
                fields = ("doc_id", "title", "text")
                assert [got_result[field] for field in fields] == [want_result[field] for field in fields]


def test_concurrent_requests_are_batched_and_rank_as_in_process(served, open_engine):
    """Requests that overlap are embedded in one encode call and searched in one pass (same k), a lone
    one as a batch of one; either way they rank exactly as the in-process engine."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    engine = open_engine(served["alpha"])
    queries = [f"{q} ({i})" for i in range(8) for q in QUERIES]
    want = {q: [x["chunk_id"] for x in r] for q, r in zip(queries, engine.search(queries, k=5), strict=True)}
    assert all(len(chunk_ids) == 5 for chunk_ids in want.values())
    url = str(served["client"].base_url)
    headers = auth(served, "alpha")

    def one(query):
        with httpx.Client(base_url=url, timeout=120) as client:
            return query, client.post("/v1/search", json={"query": query, "k": 5}, headers=headers)

    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(one, queries))
    assert len(got) == len(queries)
    batches = set()
    for query, response in got:
        assert response.status_code == 200, response.text
        assert [x["chunk_id"] for x in response.json()["results"]] == want[query], query
        assert response.json()["timings"]["path"] == "router"
        timings = response.json()["timings"]
        batches.add((timings["embed_batch"], timings["search_batch"]))
    assert max(e for e, _ in batches) > 1, batches  # some requests overlapped and were embedded together
    assert max(s for _, s in batches) > 1, batches  # ... and searched together


def test_hybrid_tenant_equals_in_process_hybrid_search(served, open_engine):
    """delta = alpha's corpus with a BM25 channel: the router sends the query text to every shard and
    merges BM25 and dense lists exactly as the in-process engine does."""
    engine = open_engine(served["delta"])
    assert engine.policy.bm25_alpha == 0.7
    for query in QUERIES + ["nonlocal"]:
        want = engine.search([query], k=10)[0]
        got = search(served, {"query": query, "k": 10}, tenant="delta").json()["results"]
        assert len(want) == 10
        assert [x["chunk_id"] for x in got] == [x["chunk_id"] for x in want]
        for got_result, want_result in zip(got, want, strict=True):
            assert got_result["score"] == pytest.approx(want_result["score"], abs=1e-4)
            assert got_result["bm25"] == pytest.approx(want_result["bm25"], abs=1e-4)
            assert 0 <= got_result["bm25"] <= 1
            assert got_result["text"] == want_result["text"]
    plain = search(served, {"query": "nonlocal", "k": 10}, tenant="alpha").json()["results"]
    hybrid = search(served, {"query": "nonlocal", "k": 10}, tenant="delta").json()["results"]
    assert len(plain) == 10
    assert all("bm25" not in x or x["bm25"] is None for x in plain)
    # BM25 is normalised by the query's best chunk over all shards, which is among the results
    assert hybrid[0]["doc_id"] == "nonlocal" and max(x["bm25"] for x in hybrid) == 1.0


def test_request_bm25_alpha_overrides_the_index_setting(served, open_engine):
    from qrag_ray.config.search_policy import SearchConfig

    base = open_engine(served["delta"])
    lexical = open_engine(served["delta"], policy=base.policy.with_bm25_alpha(0.0))
    for query in QUERIES:
        want = lexical.search([query], k=10)[0]
        got = search(served, {"query": query, "k": 10, "bm25_alpha": 0.0}, tenant="delta").json()["results"]
        assert len(want) == 10
        assert [x["chunk_id"] for x in got] == [x["chunk_id"] for x in want]
        assert [x["bm25"] for x in got] == pytest.approx([x["bm25"] for x in want], abs=1e-5)
    # alpha 1 on the hybrid index is its dense ranking
    dense = open_engine(served["delta"], policy=SearchConfig())
    got = search(served, {"query": QUERIES[0], "k": 10, "bm25_alpha": 1.0}, tenant="delta").json()["results"]
    assert len(got) == 10
    assert [x["chunk_id"] for x in got] == [x["chunk_id"] for x in dense.search([QUERIES[0]], k=10)[0]]
    # an index without a BM25 channel: a clear 409 (the request is valid, the index cannot serve it),
    # not a silent dense answer
    response = search(served, {"query": QUERIES[0], "k": 3, "bm25_alpha": 0.5}, tenant="alpha")
    assert response.status_code == 409 and response.json()["error"] == "no_bm25_index"
    assert "bm25.enabled" in response.json()["message"]
    response = search(served, {"query": QUERIES[0], "k": 3, "bm25_alpha": 1.5}, tenant="delta")
    assert response.status_code == 422


def test_min_score_filters_like_in_process(served, open_engine):
    """The served min_score drops what the in-process one drops: the same results, some of them (the query's
    own topic scores above the threshold), fewer than k."""
    engine = open_engine(served["alpha"])
    want = engine.search([QUERIES[1]], k=30, min_score=0.45)[0]
    got = search(served, {"query": QUERIES[1], "k": 30, "min_score": 0.45}).json()["results"]
    assert got, "no served result at or above min_score 0.45 for a query that names its topic"
    assert [x["chunk_id"] for x in got] == [x["chunk_id"] for x in want]
    assert all(x["score"] >= 0.45 for x in got) and len(got) < 30


# ------------------------------------------------------------------------------------ tenants
def test_tenant_isolation(served):
    query = "How do I make an object usable in a with statement?"
    alpha_results = search(served, {"query": query, "k": 20}, tenant="alpha").json()["results"]
    beta_results = search(served, {"query": query, "k": 20}, tenant="beta").json()["results"]
    assert len(alpha_results) == 20 and all(x["doc_id"] in ALPHA_TOPICS for x in alpha_results)
    assert beta_results and all(x["doc_id"] in BETA_TOPICS for x in beta_results)
    assert beta_results[0]["doc_id"] in ("with", "context-managers")
    assert not {x["chunk_id"] for x in alpha_results} & {x["chunk_id"] for x in beta_results}


def test_indexes_lists_only_the_callers_index(served):
    response = served["client"].get("/v1/indexes", headers=auth(served, "beta"))
    assert response.status_code == 200
    indexes = response.json()["indexes"]
    assert [i["name"] for i in indexes] == ["beta"] and indexes[0]["num_shards"] == 3 and indexes[0]["available"]
    written = load_manifest(served["beta"]).data  # what the build wrote, as the API reports it
    assert (indexes[0]["representation"], indexes[0]["counts"]) == (written["representation"], written["counts"])


@pytest.mark.parametrize("headers,status,kind", [
    ({}, 401, "unauthorized"),
    ({"Authorization": "Bearer qrag_not-a-real-key"}, 401, "unauthorized"),
    ({"Authorization": "Basic abc"}, 401, "unauthorized"),
])
def test_missing_or_unknown_key_is_401(served, headers, status, kind):
    response = served["client"].post("/v1/search", json={"query": "for loop", "k": 3}, headers=headers)
    assert response.status_code == status and response.json()["error"] == kind
    assert response.headers.get("www-authenticate") == "Bearer"


def test_key_for_another_tenants_index(served):
    response = search(served, {"query": "for loop", "k": 3, "index": "beta"}, tenant="alpha")
    assert response.status_code == 403 and response.json()["error"] == "forbidden"
    response = search(served, {"query": "for loop", "k": 3, "index": "nope"}, tenant="alpha")
    assert response.status_code == 404 and response.json()["error"] == "not_found"


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("body,status,kind", [
    ('{"query": ""}', 422, "invalid_request"),
    ('{"query": "   \\n "}', 422, "invalid_request"),
    ('{"query": "' + "x" * 2001 + '"}', 422, "query_too_long"),
    ('{"query": "for loop", "k": 0}', 422, "invalid_request"),
    ('{"query": "for loop", "k": 1001}', 422, "invalid_request"),
    ('{"query": "for loop", "k": "ten"}', 422, "invalid_request"),
    ('{"query": "for loop", "k": "5"}', 422, "invalid_request"),  # the schema says integer, not a string of one
    ('{"query": "for loop", "bm25_alpha": false}', 422, "invalid_request"),  # a boolean is not a number
    ('{"query": "for loop", "k": 2.5}', 422, "invalid_request"),
    ('{"query": "for loop", "mode": "bm25"}', 422, "invalid_request"),
    ('{"query": "for loop", "min_socre": 0.5}', 422, "invalid_request"),
    ('{"k": 5}', 422, "invalid_request"),
    ('{"query": "for loop", ', 400, "malformed_json"),
    ('[1, 2]', 422, "invalid_request"),
])
def test_bad_input_is_a_clear_4xx(served, body, status, kind):
    response = served["client"].post("/v1/search", content=body,
                                     headers={"content-type": "application/json", **auth(served, "alpha")})
    assert response.status_code == status, response.text
    error = response.json()
    assert error["error"] == kind and error["message"]


def test_numbers_as_json_schema_types_them(served):
    """JSON Schema's integer includes 3.0 (schemathesis sends it): the server takes what its schema allows."""
    response = search(served, {"query": "for loop", "k": 3.0, "bm25_alpha": None, "min_score": -1}, tenant="alpha")
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 3


def test_unknown_route_and_method(served):
    response = served["client"].get("/v2/search")
    assert response.status_code == 404 and response.json()["error"] == "not_found"
    response = served["client"].get("/v1/search")
    assert response.status_code == 405


# ------------------------------------------------------------------------------------ LLM paths
def test_hyde_embeds_the_llm_passage(served, fake_llm, open_engine):
    calls_before = len(fake_llm.bodies)
    query = "How do I make an object usable in a with statement?"
    response = search(served, {"query": query, "k": 5, "mode": "hyde"}, tenant="beta")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["mode"] == "hyde" and body["hypothetical"] == HYDE_PASSAGE
    assert len(fake_llm.bodies) == calls_before + 1 and "Passage:" in fake_llm.bodies[-1]["messages"][-1]["content"]
    # the vector searched is the passage's: same ranking as an in-process search for the passage text
    want = open_engine(served["beta"]).search([HYDE_PASSAGE], k=5)[0]
    assert [x["chunk_id"] for x in body["results"]] == [x["chunk_id"] for x in want]


def test_answer_cites_chunk_ids(served, fake_llm):
    query = "What does the __exit__ method of a context manager do?"
    response = served["client"].post("/v1/answer", json={"query": query, "k": 4}, headers=auth(served, "beta"))
    assert response.status_code == 200, response.text
    body = response.json()
    assert "[1]" in body["answer"] and body["answer"] != "I don't know"
    assert [c["n"] for c in body["citations"]] == [1, 2]
    ids = [x["chunk_id"] for x in body["results"]]
    assert [c["chunk_id"] for c in body["citations"]] == ids[:2]
    prompt = fake_llm.bodies[-1]["messages"][-1]["content"]
    assert body["results"][0]["text"].strip()[:60] in prompt


def test_answer_says_i_dont_know_when_the_model_does(served):
    query = f"Which {IDK_MARKER} wrote the with statement?"
    response = served["client"].post("/v1/answer", json={"query": query, "k": 3}, headers=auth(served, "beta"))
    assert response.status_code == 200
    assert response.json()["answer"] == "I don't know" and response.json()["citations"] == []


def test_answer_without_support_does_not_ask_the_llm(served, fake_llm):
    calls_before = len(fake_llm.bodies)
    response = served["client"].post("/v1/answer", json={"query": "zxqv blorf wibble frobnicate", "k": 3},
                                     headers=auth(served, "beta"))
    assert response.status_code == 200
    assert response.json()["answer"] == "I don't know" and response.json()["citations"] == []
    assert len(fake_llm.bodies) == calls_before


def test_answer_and_hyde_without_llm_are_501(served):
    """A feature this server does not offer is not a temporary outage (clients retry a 503)."""
    for route, body in (("/open/v1/answer", {"query": "for loop"}),
                        ("/open/v1/search", {"query": "for loop", "mode": "hyde"})):
        response = served["client"].post(route, json=body)
        assert response.status_code == 501 and response.json()["error"] == "llm_not_configured", response.text
        assert "retry-after" not in response.headers
    paths = served["client"].get("/open/openapi.json").json()["paths"]
    assert all("501" in paths[p]["post"]["responses"] for p in ("/v1/answer", "/v1/search"))  # documented


# ------------------------------------------------------------------------------------ metrics
def test_metrics_on_the_scrape_endpoint(served):
    """Runs last in this module: every name in EXPORTED_METRICS is on the live Prometheus endpoint."""
    import httpx

    from qrag_ray.serving.app_metrics import EXPORTED_METRICS

    for query in QUERIES:
        search(served, {"query": query, "k": 5})
    served["client"].post("/v1/search", json={"query": ""}, headers=auth(served, "alpha"))
    want_tags = ['tenant="alpha"', 'route="/v1/search"', 'kind="invalid_request"', 'index_version="']
    deadline = time.time() + 90
    missing = set(EXPORTED_METRICS)
    text = ""
    while time.time() < deadline:
        text = httpx.get(f"http://127.0.0.1:{served['metrics_port']}/metrics", timeout=30).text
        present = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
        missing = set(EXPORTED_METRICS) - present
        if not missing and all(t in text for t in want_tags):
            break
        time.sleep(2)
    assert not missing, f"not scraped: {sorted(missing)}"
    errors = [line[line.find("{"):][-300:] for line in text.splitlines() if line.startswith("ray_qrag_errors_total")]
    for tag in want_tags:
        assert tag in text, (tag, errors)


# ------------------------------------------------------------------------------------ CLI
def test_qrag_query_prints_a_table(served, capsys):
    from qrag_ray.cli import main

    url = served["url"]
    assert main(["query", "--url", url, "--key", served["keys"]["beta"], "--k", "3",
                 "How do I make an object usable in a with statement?"]) == 0
    out = capsys.readouterr().out
    assert "3 results from 'beta'" in out and ("with#" in out or "context-managers#" in out)
    assert main(["query", "--url", url, "--key", "wrong", "x"]) == 2
    assert "HTTP 401 unauthorized" in capsys.readouterr().err
    assert main(["query", "--url", url, "--key", served["keys"]["beta"], "--answer", "--k", "3",
                 "What does the __exit__ method of a context manager do?"]) == 0
    assert "[1]" in capsys.readouterr().out
    assert main(["query", "--url", url, "--key", served["keys"]["alpha"], "--bm25-alpha", "0.5", "for loop"]) == 2
    assert "HTTP 409 no_bm25_index" in capsys.readouterr().err
    assert main(["query", "--url", url, "--key", served["keys"]["delta"], "--bm25-alpha", "0", "--json",
                 "--k", "2", "nonlocal statement"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert results[0]["doc_id"] == "nonlocal" and results[0]["bm25"] == 1.0


# CI runs `qrag serve` with the proxy as a process in tests/cluster/ (on the 3-node cluster) and HAProxy on
# every pod in the RayService rehearsal (tests/cluster/test_rayservice_rehearsal.py); each ingress only here
@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize("ingress", ["proxy", "direct", "haproxy"])
def test_qrag_serve_command_end_to_end(tenant_indexes, capsys, ingress):
    """`qrag serve --index DIR` in its own process (its own local Ray), queried with `qrag query`. Needs
    only an index, not this module's Serve app (the slow tier would start one for this test alone).
    What listens on --port: Serve's proxy, the Router replica itself (`--ingress direct`) or HAProxy."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    import httpx

    from qrag_ray.cli import main
    from qrag_ray.runtime.ports import free_port

    port = free_port()
    env = {**os.environ, "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}
    # a terminal's Ctrl-C reaches the server even where this test runs with SIGINT ignored (a background
    # job of a non-interactive shell: its children inherit the ignore); HAProxy's server is stopped as a
    # container runtime stops it (SIGTERM)
    stop = signal.SIGTERM if ingress == "haproxy" else signal.SIGINT
    proc = subprocess.Popen([sys.executable, "-m", "qrag_ray.cli", "serve", "--index", str(tenant_indexes["alpha"]),
                             "--port", str(port), "--ingress", ingress], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    banner = f"qrag serving at http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 420
        while time.time() < deadline and proc.poll() is None and not any(banner in ln for ln in lines):
            time.sleep(1)
        assert any(banner in ln for ln in lines), f"qrag serve did not come up (rc={proc.poll()}): {lines[-20:]}"
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).json()["status"] == "ok"
        assert main(["query", "--url", f"http://127.0.0.1:{port}", "--k", "2", QUERIES[0]]) == 0
        assert "2 results from 'default'" in capsys.readouterr().out
        import psutil

        owner = [c.pid for c in psutil.net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]
        title = " ".join(psutil.Process(owner[0]).cmdline()) if owner else ""
        assert {"proxy": "ProxyActor" in title, "haproxy": "haproxy" in title,
                "direct": "ServeReplica" in title and "Router" in title}[ingress], title
    finally:
        proc.send_signal(stop)
        stop_started = time.time()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stop_s = time.time() - stop_started
        reader.join(timeout=10)
    # Ctrl-C (or SIGTERM) stops it by itself, without a replica's load-balancer drain (Serve's 30 s),
    # and takes HAProxy's files (the folder of its config) with it
    assert stop_s < 60 and proc.returncode == 0, (stop_s, proc.returncode, lines[-20:])
    haproxy_configs = [Path(a) for a in title.split() if a.endswith("haproxy.cfg")]
    assert all(not c.parent.exists() for c in haproxy_configs), haproxy_configs
    if ingress == "haproxy":
        assert haproxy_configs, title


# ------------------------------------------------------------------------------------ OpenAPI
def _spec() -> dict:
    from qrag_ray.serving.router import app

    return app.openapi()


def test_served_openapi_is_the_one_fuzzed(served):
    """The schema below is built in-process at collection time; it must be the server's own."""
    served_spec = served["client"].get("/openapi.json").json()
    ours = json.loads(json.dumps(_spec()))
    served_spec.pop("servers", None)  # Serve adds the route prefix it is mounted at
    assert served_spec == ours


def _schemathesis_schema():
    import schemathesis

    return schemathesis.openapi.from_dict(_spec())


_SCHEMA = _schemathesis_schema()


@_SCHEMA.parametrize()
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_openapi_fuzz_finds_nothing(case, served):
    """schemathesis against the live app over loopback: every response (valid and invalid inputs)
    matches the documented status codes, headers and bodies; no 5xx. Bounded examples per route."""
    case.call_and_validate(base_url=served["url"], headers=auth(served, "delta"))


# ------------------------------------------------------------------------------------ metadata filters, fetch
FILTERS = [
    {"type": "eq", "key": "area", "value": "loops"},
    {"type": "and", "filters": [{"type": "gte", "key": "added", "value": "2024-03-05"},
                                {"type": "eq", "key": "statement", "value": True}]},
    {"type": "or", "filters": [{"type": "in", "key": "letters", "value": ["f", "w"]},
                               {"type": "lt", "key": "reviewed", "value": "2024-04-01T02:00:00Z"}]},
    {"type": "nin", "key": "area", "value": ["values", "names"]},
]


def _chosen(filter_spec: dict | None, doc_ids=None) -> set[str]:
    from support.brute_force import passes
    from support.corpus import topic_metadata

    return {n for i, n in enumerate(ALPHA_TOPICS) if (filter_spec is None or passes(filter_spec, topic_metadata(i, n)))
            and (doc_ids is None or n in doc_ids)}


@pytest.mark.parametrize("filter_spec", FILTERS, ids=lambda filter_spec: filter_spec["type"])
def test_filtered_search_is_exact_served_as_in_process(served, filter_spec):
    """delta (3 shards, Flat, BM25, metadata): each filtered page holds exactly min(k, chunks that pass)
    distinct chunks, all passing, equal to brute force over the filtered subset (dense: every vector;
    BM25: every chunk's score), and served exactly as the in-process engine ranks (dense, BM25, hybrid)."""
    from qrag_ray.config.search_policy import SearchConfig
    from qrag_ray.search.engine import SearchEngine
    from support.brute_force import bm25_truth, dense_truth

    engines = {a: SearchEngine(served["delta"], policy=SearchConfig().with_bm25_alpha(a) if a is not None else None)
               for a in (None, 0.0, 1.0)}  # the index's hybrid 0.7, BM25 alone, dense alone
    chosen = _chosen(filter_spec)
    chunk_docs = [doc_id for shard in engines[None].shards for doc_id in shard.chunk_columns[1].to_pylist()]
    n_chosen = sum(doc_id in chosen for doc_id in chunk_docs)
    assert n_chosen > 0
    query = QUERIES[0]
    for alpha, engine in engines.items():
        for k in (3, 30):
            want = engine.search([query], k=k, filter=filter_spec)[0]
            body = {"query": query, "k": k, "filter": filter_spec, **({} if alpha is None else {"bm25_alpha": alpha})}
            got = search(served, body, tenant="delta").json()["results"]
            assert [x["chunk_id"] for x in got] == [x["chunk_id"] for x in want]
            assert [x["score"] for x in got] == pytest.approx([x["score"] for x in want], abs=1e-4)
            assert len({x["chunk_id"] for x in got}) == len(got) == min(k, n_chosen)
            assert all(x["doc_id"] in chosen and x["metadata"]["area"] for x in got)
            if alpha == 1.0:
                truth = dense_truth(engine, engine.embed([query]), chosen)[0][:k]
                assert [x["chunk_id"] for x in got] == [c for c, _ in truth]
                assert [x["score"] for x in got] == pytest.approx([s for _, s in truth], abs=1e-4)
            if alpha == 0.0:  # each chunk's BM25 over the best passing one's; without one, the lexical floor
                lex, per_shard = bm25_truth(engine, query, chosen)
                floor = min([min(sc) / lex[0][1] for sc in per_shard if sc and min(sc) > 0] or [0.0])
                lexical_scores = dict(lex)
                want_bm25 = [lexical_scores[x["chunk_id"]] / lex[0][1] if x["chunk_id"] in lexical_scores else floor
                             for x in got]
                assert [x["bm25"] for x in got] == pytest.approx(want_bm25, abs=1e-4)
                assert got[0]["bm25"] == 1.0


def test_results_carry_metadata_and_url(served):
    from support.corpus import topic_metadata

    got = search(served, {"query": QUERIES[0], "k": 5}, tenant="delta").json()["results"]
    meta = {n: topic_metadata(i, n) for i, n in enumerate(ALPHA_TOPICS)}
    assert len(got) == 5
    for result in got:
        assert result["metadata"] == meta[result["doc_id"]]
        assert result["url"] == f"https://docs.python.org/3/reference/{result['doc_id']}.html"
    plain = search(served, {"query": QUERIES[0], "k": 2}).json()["results"]  # alpha: no metadata
    assert len(plain) == 2
    assert all(x["metadata"] == {} and x["url"] is None for x in plain)


def test_doc_ids_and_filters_on_answer_and_an_index_without_metadata(served, fake_llm):
    ids = ["while", "break", "pass"]
    got = search(served, {"query": QUERIES[0], "k": 40, "doc_ids": ids}).json()["results"]
    assert {x["doc_id"] for x in got} == set(ids)  # alpha has no metadata fields, but doc_ids always works
    response = served["client"].post("/v1/answer", json={"query": QUERIES[0], "k": 3, "filter": FILTERS[0]},
                                     headers=auth(served, "delta"))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["results"] and all(x["doc_id"] in _chosen(FILTERS[0]) for x in answer["results"])
    assert {c["chunk_id"] for c in answer["citations"]} <= {x["chunk_id"] for x in answer["results"]}


@pytest.mark.parametrize("tenant,filter_spec,needle", [
    ("delta", {"type": "eq", "key": "colour", "value": "red"},
     "unknown metadata field 'colour'; this index has: added, area, letters, order, reviewed, statement"),
    ("delta", {"type": "gt", "key": "statement", "value": True}, "'gt' does not apply to field 'statement'"),
    ("delta", {"type": "gte", "key": "added", "value": "2024-3-5"}, "is not an ISO-8601 date"),
    ("delta", {"type": "eq", "key": "order", "value": "three"}, "field 'order' is a number"),
    ("delta", {"type": "in", "key": "area", "value": ["x"] * 1001}, "at most 1000"),
    ("delta", {"type": "and", "filters": []}, "at least 1"),
    ("delta", {"type": "like", "key": "area", "value": "x"}, "filter"),
    ("alpha", {"type": "eq", "key": "area", "value": "loops"}, "built without document metadata"),
])
def test_invalid_filters_are_422_invalid_filter(served, tenant, filter_spec, needle):
    response = search(served, {"query": QUERIES[0], "k": 3, "filter": filter_spec}, tenant=tenant)
    assert response.status_code == 422 and response.json()["error"] == "invalid_filter", response.text
    assert needle in response.json()["message"] and "\n" not in response.json()["message"]


def test_too_deep_filters_and_bodies_are_4xx_and_the_replica_lives_on(served):
    deep = FILTERS[0]
    for _ in range(9):
        deep = {"type": "or", "filters": [deep]}
    response = search(served, {"query": QUERIES[0], "filter": deep}, tenant="delta")
    assert response.status_code == 422 and "deeper than 8" in response.json()["message"], response.text
    body = '{"query": "x", "filter": ' + '{"type": "or", "filters": [' * 3000 + "]}" * 3000 + "}"
    headers = {"content-type": "application/json", **auth(served, "delta")}
    response = served["client"].post("/v1/search", content=body, headers=headers)
    assert 400 <= response.status_code < 500, response.text
    assert search(served, {"query": QUERIES[0], "k": 1}, tenant="delta").status_code == 200


def _quoted(identifier: str) -> str:
    from urllib.parse import quote

    return quote(identifier, safe="")


def test_fetch_a_chunk_and_a_document_by_id(served):
    client = served["client"]
    result = search(served, {"query": QUERIES[0], "k": 1}, tenant="delta").json()["results"][0]
    response = client.get(f"/v1/chunks/{_quoted(result['chunk_id'])}", headers=auth(served, "delta"))
    assert response.status_code == 200, response.text
    got = response.json()
    fields = ("chunk_id", "doc_id", "title", "text", "url", "metadata")
    assert {k: got[k] for k in fields} == {k: result[k] for k in fields}
    assert got["questions"] == [] and got["index"] == "delta" and got["index_version"]
    response = client.get(f"/v1/documents/{result['doc_id']}", headers=auth(served, "delta"))
    assert response.status_code == 200, response.text
    doc = response.json()
    chunk_ids = [x["chunk_id"] for x in doc["chunks"]]
    assert chunk_ids == [f"{result['doc_id']}#{i}" for i in range(len(chunk_ids))]  # document order
    assert result["chunk_id"] in chunk_ids
    assert doc["metadata"] == result["metadata"] and doc["url"] == result["url"]
    assert " ".join(x["text"] for x in doc["chunks"]).startswith(doc["chunks"][0]["text"])


def test_fetch_obeys_tenant_keys(served):
    client = served["client"]
    alpha_chunk = search(served, {"query": QUERIES[0], "k": 1}).json()["results"][0]["chunk_id"]
    assert client.get(f"/v1/chunks/{_quoted(alpha_chunk)}", headers=auth(served, "alpha")).status_code == 200
    response = client.get(f"/v1/chunks/{_quoted(alpha_chunk)}", headers=auth(served, "beta"))  # not in beta's index
    assert response.status_code == 404 and response.json()["error"] == "not_found"
    response = client.get(f"/v1/chunks/{_quoted(alpha_chunk)}?index=alpha", headers=auth(served, "beta"))
    assert response.status_code == 403 and response.json()["error"] == "forbidden"
    response = client.get("/v1/documents/for?index=alpha", headers=auth(served, "beta"))
    assert response.status_code == 403
    assert client.get("/v1/documents/for", headers=auth(served, "beta")).status_code == 404
    assert client.get(f"/v1/chunks/{_quoted(alpha_chunk)}").status_code == 401
    response = client.get(f"/v1/chunks/{_quoted('nope#0')}", headers=auth(served, "alpha"))
    assert response.status_code == 404 and "no chunk 'nope#0'" in response.json()["message"]
    response = client.get("/v1/documents/nope", headers=auth(served, "alpha"))
    assert response.status_code == 404 and response.json()["error"] == "not_found"
