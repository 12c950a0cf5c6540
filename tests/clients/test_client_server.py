"""The client and its adapters against a real qrag server: one Serve app for the whole module (real local
Ray, Serve over HTTP, FAISS, MiniLM; the LLM is the suite's fake OpenAI-compatible server), tenants with
keys. The client's results and errors (401/403/404/409/422/429, Retry-After honoured), `qrag query`
through it, LangChain's standard retriever tests, and the LlamaIndex retriever and the MCP tools (stdio
and streamable HTTP, through the SDK's own client) returning the chunks /v1/search returns, in its order.

LlamaIndex's QueryFusionRetriever in each fusion mode over the retriever and a filtered copy: one node
per chunk, its ranks and scores fused. The MCP tool `search` with an agent's k and filter under the
server's bound. The search filter and the fetch routes ship with this server: a server without them
fails these tests."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from langchain_tests.integration_tests import RetrieversIntegrationTests

from fake_openai_server import running_fake_openai
from qrag_client import AsyncQragClient, QragClient, RetryPolicy, errors
from qrag_ray.index.representations import dedup_questions
from qrag_ray.runtime.ports import free_port
from support.corpus import PYDOC_QUESTIONS

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS and Serve

REPO = Path(__file__).resolve().parents[2]
QUERY = "When does the else clause of a for loop run?"
LOOPS = {"type": "eq", "key": "group", "value": "loops"}
ANSWER = "The else clause runs when the loop ends without break [1]."
_SERVER: dict = {}  # for the LangChain standard tests, whose constructor parameters are properties


@pytest.fixture(scope="module")
def server(local_ray, client_index, tmp_path_factory):
    """Serve over `client_index`: tenants main and other (the same index, their own keys) and limited
    (0.5 requests/s, a burst of 1); the fake LLM answers /v1/answer."""
    from ray import serve

    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import add_tenant

    tenants_file = tmp_path_factory.mktemp("client-serve") / "tenants.yaml"
    keys = {"main": add_tenant(tenants_file, "main", client_index),
            "other": add_tenant(tenants_file, "other", client_index),
            "limited": add_tenant(tenants_file, "limited", client_index, rate_limit={"rps": 0.5, "burst": 1})}
    with running_fake_openai(lambda messages: ANSWER) as llm:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        small = {"ray_actor_options": {"num_cpus": 0.5}}
        gen = {"backend": "openai", "base_url": llm.url, "model": "fake-llm", "api_key_env": ""}
        serve.run(compose_app({"tenants": str(tenants_file), "generator": gen},
                              {name: small for name in ("Router", "ShardSearcher0", "Synthesizer")}),
                  name="qrag", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        while httpx.get(f"{url}/readyz", timeout=30).status_code != 200:
            assert time.time() < deadline, "the app did not become ready"
            time.sleep(1)
        info = {"url": url, "keys": keys, "index": client_index, "llm": llm}
        _SERVER.update(info)
        try:
            yield info
        finally:
            serve.shutdown()


def raw_search(server, body: dict, tenant: str = "main") -> dict:
    response = httpx.post(f"{server['url']}/v1/search", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {server['keys'][tenant]}"})
    assert response.status_code == 200, response.text
    return response.json()


def ranked(page: dict) -> list[tuple[str, float]]:
    return [(r["chunk_id"], r["score"]) for r in page["results"]]


def make_client(server, tenant: str = "main", **options) -> QragClient:
    return QragClient(server["url"], server["keys"][tenant] if tenant else None, **options)


# ---------------------------------------------------------------------------------------- the client
def test_search_returns_what_the_api_returns_typed(server):
    want = raw_search(server, {"query": QUERY, "k": 5})
    with make_client(server) as client:
        page = client.search(QUERY, 5)
    assert page.model_dump(mode="json", exclude_unset=True)["results"] == want["results"]
    assert page.results[0].doc_id == "for" and page.index == "main"
    # the product's point: a generated question matched, and the client names it
    assert page.results[0].matched_question in PYDOC_QUESTIONS["for"]

    async def run():
        async with AsyncQragClient(server["url"], server["keys"]["main"]) as client:
            return await client.search(QUERY, 5)

    assert ranked(asyncio.run(run()).model_dump()) == ranked(want)


def test_answer_indexes_and_keys(server):
    with make_client(server) as client:
        response = client.answer(QUERY, 3)
        assert response.answer == ANSWER and [x.n for x in response.citations] == [1]
        assert response.citations[0].chunk_id == response.results[0].chunk_id
        (index,) = client.indexes().indexes
        assert (index.name, index.representation, index.available, index.num_shards) == ("main", "hybrid", True, 1)
    with make_client(server, "other") as client:  # another key: another tenant, same index behind it
        assert client.indexes().indexes[0].name == "other"


@pytest.mark.parametrize("tenant,call,error_class,kind", [
    (None, lambda client: client.search(QUERY), errors.AuthenticationError, "unauthorized"),
    ("bad", lambda client: client.search(QUERY), errors.AuthenticationError, "unauthorized"),
    ("main", lambda client: client.search(QUERY, index="other"), errors.PermissionDeniedError, "forbidden"),
    ("main", lambda client: client.search(QUERY, index="nosuch"), errors.NotFoundError, "not_found"),
    ("main", lambda client: client.search(QUERY, bm25_alpha=0.5), errors.ConflictError, "no_bm25_index"),
    ("main", lambda client: client.search(QUERY, 0), errors.InvalidRequestError, "invalid_request"),
    ("main", lambda client: client.search("x" * 2001), errors.InvalidRequestError, "query_too_long"),
])
def test_api_errors_are_typed(server, tenant, call, error_class, kind):
    key = "qrag_not-a-key" if tenant == "bad" else server["keys"].get(tenant)
    with QragClient(server["url"], key) as client, pytest.raises(error_class) as got:
        call(client)
    error = got.value
    assert type(error) is error_class and error.status == error_class.status
    assert error.kind == kind and error.message
    if error_class is errors.InvalidRequestError and kind == "invalid_request":
        assert error.detail and error.detail[0]["loc"][-1] == "k"


def test_a_missed_deadline_is_a_504_naming_its_stage_and_the_next_request_is_answered(server):
    """An LLM slower than the app's deadline (request_timeout_s, 10 s by default): the request ends at the
    deadline with 504 deadline_exceeded naming the stage it was in, typed by the client."""
    llm = server["llm"]
    llm.delay_s = 12.0
    try:
        started = time.monotonic()
        with (make_client(server, retry=RetryPolicy(max_retries=0)) as client,
              pytest.raises(errors.DeadlineExceededError) as got):
            client.answer(QUERY, 3)
        took = time.monotonic() - started
    finally:
        llm.delay_s = 0.0
    assert got.value.kind == "deadline_exceeded" and "writing the answer (LLM)" in got.value.message, got.value.message
    assert 9.5 < took < 11.5, took
    with make_client(server) as client:
        assert client.answer(QUERY, 3).answer == ANSWER


def test_rate_limit_is_typed_and_its_retry_after_honoured(server):
    with make_client(server, "limited", retry=RetryPolicy(max_retries=0)) as client:
        client.search(QUERY, 1)
        with pytest.raises(errors.RateLimitError) as got:
            client.search(QUERY, 1)
    wait = got.value.retry_after
    assert wait is not None and wait >= 1
    started = time.monotonic()
    with make_client(server, "limited", retry=RetryPolicy(max_retries=2, max_wait_s=10)) as client:
        assert len(client.search(QUERY, 1).results) == 1  # 429 first, then the retry after waiting Retry-After
    assert time.monotonic() - started >= wait - 0.5


def test_qrag_query_prints_the_body_and_the_table_and_one_error_line(server, capsys):
    from qrag_ray.cli import main

    want = raw_search(server, {"query": QUERY, "k": 3, "mode": "default"})
    assert main(["query", "--url", server["url"], "--key", server["keys"]["main"], "--k", "3", "--json", QUERY]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["results"] == want["results"] and set(got) == set(want)
    assert main(["query", "--url", server["url"], "--key", server["keys"]["main"], "--k", "3", QUERY]) == 0
    out = capsys.readouterr().out
    assert "3 results from 'main'" in out and all(r["chunk_id"] in out for r in want["results"])
    assert main(["query", "--url", server["url"], "--key", "qrag_wrong", QUERY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: HTTP 401 unauthorized: ") and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------- LangChain
class TestLangChainStandardRetriever(RetrieversIntegrationTests):
    """langchain-tests' own retriever contract, against the module's server."""

    pytestmark = [pytest.mark.asyncio(loop_scope="function"),  # its one async test; the sync ones may ignore it
                  pytest.mark.filterwarnings("ignore:.*marked with '@pytest.mark.asyncio' but it is not an async")]

    @pytest.fixture(autouse=True)
    def _server(self, server):
        return server

    @property
    def retriever_constructor(self):
        from qrag_client.langchain import QragRetriever

        return QragRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"url": _SERVER["url"], "api_key": _SERVER["keys"]["main"]}

    @property
    def retriever_query_example(self) -> str:
        return QUERY


def test_langchain_documents_carry_the_chunk(server):
    from qrag_client.langchain import QragRetriever

    want = raw_search(server, {"query": QUERY, "k": 4})
    retriever = QragRetriever(url=server["url"], api_key=server["keys"]["main"])
    docs = retriever.invoke(QUERY)
    assert [(d.id, d.metadata["score"]) for d in docs] == ranked(want)
    document = docs[0]
    expected = want["results"][0]
    assert document.page_content == expected["text"]
    assert document.metadata["doc_id"] == expected["doc_id"] and document.metadata["title"] == expected["title"]
    assert document.metadata["matched_question"] in PYDOC_QUESTIONS["for"] and document.metadata["index"] == "main"
    assert document.metadata["index_version"] == want["index_version"] and "url" in document.metadata
    assert [x.id for x in asyncio.run(retriever.ainvoke(QUERY, k=2))] == [c for c, _ in ranked(want)[:2]]


def test_langchain_filter_and_doc_ids_as_fields_and_per_call(server):
    from qrag_client.langchain import QragRetriever

    want = raw_search(server, {"query": QUERY, "k": 3, "filter": LOOPS})
    assert len(want["results"]) == 3  # the comparisons below are not of two empty lists
    retriever = QragRetriever(url=server["url"], api_key=server["keys"]["main"], k=3, filter=LOOPS)
    assert [(d.id, d.metadata["score"]) for d in retriever.invoke(QUERY)] == ranked(want)
    assert all(d.metadata["group"] == "loops" for d in retriever.invoke(QUERY))
    plain = QragRetriever(url=server["url"], api_key=server["keys"]["main"])
    assert [d.id for d in plain.invoke(QUERY, k=3, filter=LOOPS)] == [c for c, _ in ranked(want)]
    assert {d.metadata["doc_id"] for d in plain.invoke(QUERY, k=2, doc_ids=["while"])} == {"while"}


# ---------------------------------------------------------------------------------------- LlamaIndex
def test_llamaindex_returns_the_search_ranking(server):
    from qrag_client.llamaindex import QragLlamaIndexRetriever

    want = raw_search(server, {"query": QUERY, "k": 5})
    retriever = QragLlamaIndexRetriever(server["url"], server["keys"]["main"], similarity_top_k=5)
    nodes = retriever.retrieve(QUERY)
    assert [(n.node.node_id, n.score) for n in nodes] == ranked(want)
    assert nodes[0].node.get_content() == want["results"][0]["text"]
    assert nodes[0].node.ref_doc_id == want["results"][0]["doc_id"]
    assert [(n.node.node_id, n.score) for n in asyncio.run(retriever.aretrieve(QUERY))] == ranked(want)


def test_llamaindex_metadata_filters_are_the_search_filter(server):
    from llama_index.core.vector_stores.types import FilterCondition, MetadataFilter, MetadataFilters

    from qrag_client.llamaindex import QragLlamaIndexRetriever

    filters = MetadataFilters(condition=FilterCondition.OR, filters=[
        MetadataFilter(key="group", value="loops"),
        MetadataFilters(filters=[MetadataFilter(key="order", value=9, operator=">="),
                                 MetadataFilter(key="group", value=["branches", "expressions"], operator="in")])])
    qrag_filter = {"type": "or", "filters": [LOOPS, {"type": "and", "filters": [
        {"type": "gte", "key": "order", "value": 9},
        {"type": "in", "key": "group", "value": ["branches", "expressions"]}]}]}
    want = raw_search(server, {"query": QUERY, "k": 6, "filter": qrag_filter})
    retriever = QragLlamaIndexRetriever(server["url"], server["keys"]["main"], similarity_top_k=6, filters=filters)
    nodes = retriever.retrieve(QUERY)
    assert [(n.node.node_id, n.score) for n in nodes] == ranked(want) and len(nodes) == 6
    for hit in nodes:
        metadata = hit.node.metadata
        later_branch_or_expression = metadata["order"] >= 9 and metadata["group"] in ("branches", "expressions")
        assert metadata["group"] == "loops" or later_branch_or_expression, metadata


FUSION_K = 8  # chunks per retriever (the filtered one has 6 to give): they share their best chunks
RRF_K = 60.0  # the constant of LlamaIndex's reciprocal rank fusion


def fused_scores(mode: str, lists: list[list[tuple[str, float]]]) -> dict[str, float]:
    """What each fusion mode of QueryFusionRetriever (one query, equal retriever weights) scores a chunk,
    from each retriever's ranked (chunk id, score) list: the sums a chunk in several lists must get."""
    fused: dict[str, float] = {}
    weight = 1.0 / len(lists)
    for ranked_list in lists:
        scores = [score for _, score in ranked_list]
        if mode == "dist_based_score":
            mean = sum(scores) / len(scores)
            spread = (sum((x - mean) ** 2 for x in scores) / len(scores)) ** 0.5
            low = mean - 3 * spread
            high = mean + 3 * spread
        else:
            low = min(scores)
            high = max(scores)
        by_score = sorted(ranked_list, key=lambda pair: pair[1], reverse=True)
        for rank, (chunk_id, score) in enumerate(by_score):
            if mode == "simple":
                fused[chunk_id] = max(fused.get(chunk_id, 0.0), score)
            elif mode == "reciprocal_rerank":
                fused[chunk_id] = fused.get(chunk_id, 0.0) + 1.0 / (rank + RRF_K)
            else:
                scaled = (score - low) / (high - low) if high != low else float(high > 0)
                fused[chunk_id] = fused.get(chunk_id, 0.0) + scaled * weight
    return fused


def _check_fusion(nodes, mode: str, lists: list[list[tuple[str, float]]]) -> None:
    ids = [n.node.node_id for n in nodes]
    assert len(ids) == len(set(ids)), f"{mode}: one chunk came back as several nodes: {ids}"
    want = fused_scores(mode, lists)
    assert set(ids) == set(want), mode  # every chunk of every list, once
    assert [n.score for n in nodes] == sorted((n.score for n in nodes), reverse=True)
    for hit in nodes:
        assert hit.score == pytest.approx(want[hit.node.node_id], rel=1e-6), (mode, hit.node.node_id)


@pytest.mark.parametrize("call", ["retrieve", "retrieve_in_threads", "aretrieve"])
@pytest.mark.parametrize("mode", ["simple", "reciprocal_rerank", "relative_score", "dist_based_score"])
def test_llamaindex_query_fusion_fuses_one_node_per_chunk(server, mode, call):
    """QueryFusionRetriever over the retriever and a filtered copy (one query: no LLM writes more): a chunk
    both return is one node, scored as its fusion mode sums its two lists' terms."""
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever

    from qrag_client.llamaindex import QragLlamaIndexRetriever

    plain = QragLlamaIndexRetriever(server["url"], server["keys"]["main"], similarity_top_k=FUSION_K)
    loops = QragLlamaIndexRetriever(server["url"], server["keys"]["main"], similarity_top_k=FUSION_K, filters=LOOPS)
    lists = [ranked(raw_search(server, {"query": QUERY, "k": FUSION_K})),
             ranked(raw_search(server, {"query": QUERY, "k": FUSION_K, "filter": LOOPS}))]
    shared = {c for c, _ in lists[0]} & {c for c, _ in lists[1]}
    assert shared and len(lists[0]) == FUSION_K  # the two lists overlap: there is something to fuse
    fusion = QueryFusionRetriever([plain, loops], llm=MockLLM(), mode=mode, num_queries=1,
                                  similarity_top_k=2 * FUSION_K, use_async=call == "retrieve_in_threads")
    nodes = asyncio.run(fusion.aretrieve(QUERY)) if call == "aretrieve" else fusion.retrieve(QUERY)
    _check_fusion(nodes, mode, lists)
    if mode == "reciprocal_rerank":  # a shared chunk scores the sum of its two ranks' terms
        chunk = sorted(shared)[0]
        ranks = [[c for c, _ in ranked_list].index(chunk) for ranked_list in lists]
        assert next(n.score for n in nodes if n.node.node_id == chunk) == \
            pytest.approx(sum(1.0 / (r + RRF_K) for r in ranks))


def test_llamaindex_a_chunk_two_phrasings_find_is_one_node(server):
    """The same chunk scored differently by two queries (what QueryFusionRetriever's generated
    sub-queries do) is still one node: the scores that differ are not in the node's metadata."""
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever

    from qrag_client.llamaindex import QragLlamaIndexRetriever

    other_phrasing = "In a for loop, when is the else block executed?"

    class OtherPhrasing(BaseRetriever):
        """The retriever, asked in other words."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def _retrieve(self, query_bundle):
            return self.inner.retrieve(other_phrasing)

    plain = QragLlamaIndexRetriever(server["url"], server["keys"]["main"], similarity_top_k=FUSION_K)
    lists = [ranked(raw_search(server, {"query": q, "k": FUSION_K})) for q in (QUERY, other_phrasing)]
    first = dict(lists[0])
    assert any(c in first and first[c] != score for c, score in lists[1])  # one chunk, two different scores
    fusion = QueryFusionRetriever([plain, OtherPhrasing(plain)], llm=MockLLM(), mode="reciprocal_rerank",
                                  num_queries=1, similarity_top_k=2 * FUSION_K, use_async=False)
    _check_fusion(fusion.retrieve(QUERY), "reciprocal_rerank", lists)


# ---------------------------------------------------------------------------------------- MCP
def _cli_env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO), str(REPO / "clients" / "python"), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _mcp_args(server, *extra: str) -> list[str]:
    return ["-m", "qrag_ray.cli", "mcp", "--url", server["url"], "--key", server["keys"]["main"], *extra]


async def _use_tools(target) -> tuple[set[str], dict, dict]:
    """(tool names, search's structured result, fetch's of the first hit), through mcp.Client."""
    from mcp import Client

    async with Client(target, read_timeout_seconds=120) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        found = await client.call_tool("search", {"query": QUERY})
        assert not found.is_error, found.content
        assert json.loads(found.content[0].text) == found.structured_content  # one text item, the same JSON
        first_id = found.structured_content["results"][0]["id"]
        fetched = await client.call_tool("fetch", {"id": first_id})
        assert not fetched.is_error, fetched.content
        missing = await client.call_tool("fetch", {"id": "nosuch#0"})
        assert missing.is_error and "unknown id" in missing.content[0].text
        return names, found.structured_content, fetched.structured_content


def _check_tools(server, names, found, fetched, body: dict) -> None:
    assert names == {"search", "fetch"}
    want = raw_search(server, body)
    assert [h["id"] for h in found["results"]] == [r["chunk_id"] for r in want["results"]]
    for hit, result in zip(found["results"], want["results"], strict=True):
        assert hit["title"] == result["title"] and hit["url"]
        assert " ".join(result["text"].split()).startswith(hit["text"].rstrip("…"))
    doc = want["results"][0]["doc_id"]
    assert fetched["id"] == want["results"][0]["chunk_id"] and fetched["metadata"]["doc_id"] == doc
    assert want["results"][0]["text"] in fetched["text"]
    assert sorted(fetched["metadata"]["questions"]) == sorted(dedup_questions(PYDOC_QUESTIONS[doc]))


def test_mcp_over_stdio(server):
    from mcp import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=_mcp_args(server, "--filter", json.dumps(LOOPS)),
                                   env=_cli_env(), cwd=str(REPO))
    names, found, fetched = asyncio.run(_use_tools(params))
    _check_tools(server, names, found, fetched, {"query": QUERY, "k": 10, "filter": LOOPS})


def test_mcp_over_streamable_http(server):
    port = free_port()
    args = _mcp_args(server, "--transport", "http", "--port", str(port), "--k", "5")
    proc = subprocess.Popen([sys.executable, *args],
                            env={**os.environ, **_cli_env()}, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "qrag mcp --transport http did not listen"
                time.sleep(0.5)
        names, found, fetched = asyncio.run(_use_tools(f"http://127.0.0.1:{port}/mcp"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    _check_tools(server, names, found, fetched, {"query": QUERY, "k": 5})


def test_qrag_mcp_refuses_a_bad_key_in_one_line(server, capsys):
    from qrag_ray.cli import main

    assert main(["mcp", "--url", server["url"], "--key", "qrag_wrong"]) == 2  # checked before serving
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: HTTP 401 unauthorized") and len(err.strip().splitlines()) == 1


def test_mcp_search_takes_k_and_a_filter_within_the_servers_bound(server):
    """An agent's k and filter reach the search; its filter is ANDed with the server's --filter, so it can
    narrow what the server allows and never widen it; an argument the tool does not declare is an error."""
    from mcp import Client

    from qrag_client.mcp_server import build_server

    bound = {"type": "in", "key": "group", "value": ["loops", "branches"]}
    mcp_server = build_server(server["url"], server["keys"]["main"], k=4, filter=bound)
    asked = {"type": "nin", "key": "tags", "value": ["for"]}

    async def run():
        async with Client(mcp_server) as client:
            return [await client.call_tool("search", arguments) for arguments in (
                {"query": QUERY, "k": 3, "filter": asked}, {"query": QUERY},
                {"query": QUERY, "filter": {"type": "eq", "key": "group", "value": "expressions"}},
                {"query": QUERY, "top_k": 3})]

    narrowed, default, outside, unknown = asyncio.run(run())
    want = raw_search(server, {"query": QUERY, "k": 3, "filter": {"type": "and", "filters": [bound, asked]}})
    hits = narrowed.structured_content["results"]
    assert [h["id"] for h in hits] == [r["chunk_id"] for r in want["results"]] and len(hits) == 3
    assert all(r["metadata"]["group"] in ("loops", "branches") and r["doc_id"] != "for" for r in want["results"])
    within_bound = raw_search(server, {"query": QUERY, "k": 4, "filter": bound})["results"]
    assert len(within_bound) == 4
    assert [h["id"] for h in default.structured_content["results"]] == [r["chunk_id"] for r in within_bound]
    assert outside.structured_content["results"] == []  # outside the bound: nothing, whatever the agent asks
    assert unknown.is_error and "top_k" in unknown.content[0].text


# ---------------------------------------------------------------------------------------- filter, fetch
def test_the_filter_and_doc_ids_reach_the_server(server):
    with make_client(server) as client:
        page = client.search(QUERY, 3, filter=LOOPS)
        assert len(page.results) == 3 and all(r.metadata["group"] == "loops" for r in page.results)
        assert all(r.url and r.url.endswith("#" + r.doc_id) for r in page.results)
        assert {r.doc_id for r in client.search(QUERY, 2, doc_ids=["while"]).results} == {"while"}
        with pytest.raises(errors.InvalidRequestError) as got:
            client.search(QUERY, filter={"type": "eq", "key": "no_such_field", "value": 1})
    assert got.value.kind == "invalid_filter" and "group" in got.value.message  # it names the index's fields


def test_fetch_a_chunk_and_its_document(server):
    with make_client(server) as client:
        first = client.search(QUERY, 1).results[0]
        chunk = client.chunk(first.chunk_id)
        assert (chunk.chunk_id, chunk.doc_id, chunk.text) == (first.chunk_id, first.doc_id, first.text)
        assert sorted(chunk.questions) == sorted(dedup_questions(PYDOC_QUESTIONS[first.doc_id]))
        assert chunk.index == "main"
        doc = client.document(first.doc_id)
        ids = [x.chunk_id for x in doc.chunks]
        assert first.chunk_id in ids and ids == sorted(ids, key=lambda i: int(i.rsplit("#", 1)[1]))
        assert doc.metadata.get("group") == "loops" and doc.url == f"https://docs.python.org/3/reference/#{doc.doc_id}"
        with pytest.raises(errors.NotFoundError) as got:
            client.chunk("nosuch#0")
        assert got.value.kind == "not_found"
        with pytest.raises(errors.PermissionDeniedError):
            client.document(first.doc_id, index="other")
