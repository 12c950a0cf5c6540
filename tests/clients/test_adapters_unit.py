"""The framework adapters' own logic without a server: what a LangChain Document and a LlamaIndex node
carry, LlamaIndex's MetadataFilters as the search filter (and the operators refused), and the MCP tools'
shapes (ChatGPT connectors' search/fetch) through the SDK's in-process client, the qrag server being an
httpx.MockTransport that answers as the API does. tests/clients/test_client_server.py runs them against
a real server."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from qrag_client.models import SearchResponse

PAGE = {"results": [
    {"chunk_id": "for#1", "doc_id": "for", "title": "The for topic", "score": 0.7, "cosine": 0.7,
     "text": "The else clause.", "url": "https://docs.example/for", "metadata": {"group": "loops", "score": "clash"},
     "matched": [{"kind": "question", "text": "When does the else clause run?", "score": 0.7}]},
    {"chunk_id": "while#0", "doc_id": "while", "title": "", "score": 0.5, "text": "While loops. " * 80,
     "matched": [{"kind": "chunk", "text": "While loops.", "score": 0.5}]}],
    "index": "acme", "index_version": "v9", "mode": "default", "took_ms": 2.0}


def test_langchain_documents():
    pytest.importorskip("langchain_core")
    from qrag_client.langchain import to_documents

    for_chunk, while_chunk = to_documents(SearchResponse.model_validate(PAGE))
    assert (for_chunk.id, for_chunk.page_content) == ("for#1", "The else clause.")
    assert for_chunk.metadata["matched_question"] == "When does the else clause run?"
    assert for_chunk.metadata["matched_kind"] == "question"
    assert (for_chunk.metadata["doc_id"], for_chunk.metadata["url"], for_chunk.metadata["index_version"]) == (
        "for", "https://docs.example/for", "v9")
    # the chunk's own fields sit beside ours; on a clash ours win and theirs stay whole under `metadata`
    assert for_chunk.metadata["group"] == "loops" and for_chunk.metadata["score"] == 0.7
    assert for_chunk.metadata["metadata"] == {"group": "loops", "score": "clash"}
    assert while_chunk.metadata["matched_question"] is None and while_chunk.metadata["url"] is None


def test_llamaindex_nodes_and_filters():
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import MetadataMode
    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

    from qrag_client.llamaindex import QragLlamaIndexRetriever, UnsupportedFilterError, to_nodes, to_qrag_filter

    hit = to_nodes(SearchResponse.model_validate(PAGE))[0]
    assert (hit.node.node_id, hit.score, hit.node.ref_doc_id) == ("for#1", 0.7, "for")
    llm_view = hit.node.get_content(metadata_mode=MetadataMode.LLM)
    assert "The for topic" in llm_view and "v9" not in llm_view  # no bookkeeping for the LLM
    # this query's match sits on the NodeWithScore, not in the node's metadata, which identifies the node
    assert (hit.cosine, hit.bm25, hit.matched_question, hit.matched_kind) == (
        0.7, None, "When does the else clause run?", "question")
    assert set(hit.node.metadata) == {"group", "score", "chunk_id", "doc_id", "title", "url", "index", "index_version",
                                      "metadata"}
    assert hit.node.metadata["score"] == "clash"  # the chunk's own field: no score of ours shadows it
    # the same chunk matched by another query with other scores is the same node (hash) to LlamaIndex
    other = {**PAGE, "results": [{**PAGE["results"][0], "score": 0.2, "cosine": 0.2, "matched": []}]}
    again = to_nodes(SearchResponse.model_validate(other))[0]
    assert again.node.hash == hit.node.hash and again.score == 0.2 and again.matched_question is None

    filters = MetadataFilters(filters=[MetadataFilter(key="group", value="loops"),
                                       MetadataFilter(key="order", value=3, operator="<"),
                                       MetadataFilter(key="tags", value=["a"], operator="nin")])
    assert to_qrag_filter(filters) == {"type": "and", "filters": [{"type": "eq", "key": "group", "value": "loops"},
                                                                  {"type": "lt", "key": "order", "value": 3},
                                                                  {"type": "nin", "key": "tags", "value": ["a"]}]}
    assert to_qrag_filter(MetadataFilters(filters=[MetadataFilter(key="a", value=1, operator="!=")])) == \
        {"type": "ne", "key": "a", "value": 1}
    assert to_qrag_filter(MetadataFilters(filters=[])) is None
    for bad, says in [(MetadataFilter(key="a", value="x", operator="text_match"),
                       "'text_match' on 'a' is not supported"),
                      (MetadataFilter(key="a", value=["x"], operator="any"), "'any'"),
                      (MetadataFilter(key="a", value="x", operator="nin"), "takes a list"),
                      (MetadataFilters(filters=[MetadataFilter(key="a", value=1)], condition="not"), "'not'")]:
        with pytest.raises(UnsupportedFilterError, match=says):
            to_qrag_filter(bad if isinstance(bad, MetadataFilters) else MetadataFilters(filters=[bad]))
    with pytest.raises(UnsupportedFilterError):  # refused when the retriever is made, not at the first query
        QragLlamaIndexRetriever("http://x", filters=MetadataFilters(filters=[
            MetadataFilter(key="a", value="x", operator="contains")]))
    raw = {"type": "eq", "key": "flag", "value": True}  # the search filter itself passes as it is
    assert QragLlamaIndexRetriever("http://x", filters=raw).filter == raw


def _api(request: httpx.Request) -> httpx.Response:
    path = request.url.raw_path.decode()
    if path == "/v1/search":
        return httpx.Response(200, json=PAGE)
    if path.startswith("/v1/chunks/for%231"):
        return httpx.Response(200, json={"chunk_id": "for#1", "doc_id": "for", "title": "The for topic", "text": "x",
                                         "questions": ["When does the else clause run?"], "index": "acme",
                                         "index_version": "v9", "metadata": {"group": "loops"}, "url": None})
    if path == "/v1/documents/for":
        return httpx.Response(200, json={"doc_id": "for", "title": "The for topic", "url": None,
                                         "metadata": {"group": "loops"}, "index": "acme", "index_version": "v9",
                                         "chunks": [{"chunk_id": "for#0", "title": "", "text": "A for loop."},
                                                    {"chunk_id": "for#1", "title": "", "text": "The else clause."}]})
    return httpx.Response(404, json={"error": "not_found", "message": "unknown id"})


def test_mcp_tools_have_the_connector_shapes():
    pytest.importorskip("mcp")
    from mcp import Client

    from qrag_client.mcp_server import SNIPPET_CHARS, build_server

    server = build_server("http://qrag.test:8000", "k", k=2, transport=httpx.MockTransport(_api))

    async def run():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            found = await client.call_tool("search", {"query": "else?"})
            by_chunk = await client.call_tool("fetch", {"id": "for#1"})
            by_doc = await client.call_tool("fetch", {"id": "for"})
            missing = await client.call_tool("fetch", {"id": "nope"})
            return tools, found, by_chunk, by_doc, missing

    tools, found, by_chunk, by_doc, missing = asyncio.run(run())
    assert set(tools) == {"search", "fetch"}
    assert list(tools["search"].input_schema["properties"]) == ["query", "k", "filter"]
    assert tools["search"].input_schema["required"] == ["query"]  # a connector calls it with the query alone
    assert list(tools["fetch"].input_schema["properties"]) == ["id"]
    assert all(t.input_schema["additionalProperties"] is False for t in tools.values())
    assert not any(line.startswith(" ") for t in tools.values() for line in t.description.splitlines())
    assert all(t.annotations.read_only_hint for t in tools.values())
    hits = found.structured_content["results"]
    assert json.loads(found.content[0].text) == found.structured_content
    assert [h["id"] for h in hits] == ["for#1", "while#0"] and set(hits[0]) == {"id", "title", "url", "text"}
    assert hits[0]["url"] == "https://docs.example/for"  # its own URL, else the chunk's on the API
    assert hits[1]["url"] == "http://qrag.test:8000/v1/chunks/while%230" and hits[1]["title"] == "while"
    assert len(hits[1]["text"]) == SNIPPET_CHARS
    doc = by_chunk.structured_content
    assert set(doc) == {"id", "title", "text", "url", "metadata"} and doc["id"] == "for#1"
    assert doc["text"] == "A for loop.\n\nThe else clause." and doc["url"] == "http://qrag.test:8000/v1/documents/for"
    assert doc["metadata"] == {"group": "loops", "doc_id": "for", "index": "acme", "index_version": "v9",
                               "chunk_id": "for#1", "questions": ["When does the else clause run?"]}
    assert by_doc.structured_content["text"] == doc["text"] and "questions" not in by_doc.structured_content["metadata"]
    assert missing.is_error and "unknown id 'nope'" in missing.content[0].text


def test_qrag_mcp_says_in_one_line_when_the_server_cannot_be_reached(capsys):
    pytest.importorskip("mcp")
    from qrag_client.mcp_server import main

    assert main(["--url", "http://127.0.0.1:9"]) == 2
    assert main(["--url", "http://127.0.0.1:9", "--filter", "[1]"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == ["error: cannot reach http://127.0.0.1:9: [Errno 111] Connection refused",
                                              'error: --filter must be a JSON object, e.g. {"type": "eq", "key": '
                                              '"lang", "value": "en"}']


def _searches(server_filter, arguments_list, k=3):
    """The bodies the MCP tool `search` sends for each call's arguments, and each call's result."""
    from mcp import Client

    from qrag_client.mcp_server import build_server

    bodies = []

    def api(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=PAGE)

    server = build_server("http://qrag.test", "k", k=k, filter=server_filter, transport=httpx.MockTransport(api))

    async def run():
        async with Client(server) as client:
            return [await client.call_tool("search", arguments) for arguments in arguments_list]

    return asyncio.run(run()), bodies


def test_mcp_search_takes_k_and_a_filter_anded_with_the_servers():
    pytest.importorskip("mcp")
    bound = {"type": "eq", "key": "tenant_group", "value": "a"}
    mine = {"type": "or", "filters": [{"type": "in", "key": "lang", "value": ["en", "de"]},
                                      {"type": "gte", "key": "year", "value": 2020}]}
    results, bodies = _searches(bound, [{"query": "q"}, {"query": "q", "k": 7, "filter": mine},
                                        {"query": "q", "filter": json.dumps(mine)}])  # some clients send JSON text
    assert not any(r.is_error for r in results), [r.content for r in results if r.is_error]
    assert bodies[0] == {"query": "q", "k": 3, "filter": bound}  # the server's --k and --filter
    assert bodies[1] == {"query": "q", "k": 7, "filter": {"type": "and", "filters": [bound, mine]}}
    assert bodies[2] == bodies[1] | {"k": 3}
    results, bodies = _searches(None, [{"query": "q", "filter": mine}])
    assert bodies == [{"query": "q", "k": 3, "filter": mine}]  # no bound: the agent's filter alone


@pytest.mark.parametrize("arguments,says", [
    ({"query": "q", "bogus": 1}, "bogus"),
    ({"query": "q", "filters": {"type": "eq", "key": "a", "value": 1}}, "filters"),
    ({"query": "q", "k": 0}, "greater than or equal to 1"),
    ({"query": "q", "k": 1001}, "less than or equal to 1000"),
    ({"query": "q", "filter": {"type": "like", "key": "a", "value": "x"}}, "like"),
    ({"query": "q", "filter": {"type": "eq", "key": "a", "value": 1, "extra": 2}}, "extra"),
])
def test_mcp_search_refuses_what_its_schema_does_not_allow(arguments, says):
    pytest.importorskip("mcp")
    results, bodies = _searches(None, [arguments])
    assert results[0].is_error and says in results[0].content[0].text and bodies == []  # nothing reached the server


def test_mcp_k_must_be_in_range():
    pytest.importorskip("mcp")
    from qrag_client.mcp_server import build_server, main

    with pytest.raises(ValueError, match="--k must be 1..1000, not 0"):
        build_server("http://qrag.test", k=0)
    assert main(["--url", "http://127.0.0.1:9", "--k", "5000"]) == 2  # refused before reaching for the server


# ---------------------------------------------------------------------------------------- vector stores
RECEIPT = {"write_id": "w-1", "index": "acme", "operation": "upsert", "status": "queued", "documents": 1}
SEARCHABLE = {**RECEIPT, "status": "searchable", "chunks": 1, "indexed": 1, "submitted_at": 1.0, "searchable_at": 2.0}
HITS = {"results": [
    {"chunk_id": "n1#0", "doc_id": "n1", "score": 0.9, "text": "Alpha one.",
     "metadata": {"lang": "en", "ref_doc_id": "d1"}, "vector": [1.0, 0.0, 0.0]},
    {"chunk_id": "n2#0", "doc_id": "n2", "score": 0.89, "text": "Alpha one again.", "metadata": {"lang": "en"},
     "vector": [0.999, 0.0447, 0.0]},
    {"chunk_id": "n3#0", "doc_id": "n3", "score": 0.5, "text": "Gamma.", "metadata": {}, "vector": [0.6, 0.0, 0.8]}],
    "index": "acme", "index_version": "v1", "mode": "default", "took_ms": 1.0, "query_vector": [0.9, 0.0, 0.436]}


class Api:
    """Answers as the API does (a write taken, then searchable; a search page; a document; 404s), and
    keeps every request (method, path, JSON body)."""

    def __init__(self):
        self.requests: list[tuple[str, str, dict | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode().split("?")[0]
        self.requests.append((request.method, path, json.loads(request.content) if request.content else None))
        if path == "/v1/documents":
            return httpx.Response(202, json=RECEIPT)
        if path.startswith("/v1/writes/"):
            return httpx.Response(200, json=SEARCHABLE)
        if path == "/v1/search":
            return httpx.Response(200, json=HITS)
        if path == "/v1/documents/n1":
            return httpx.Response(200, json={"doc_id": "n1", "title": "", "url": None, "metadata": {"lang": "en"},
                                             "index": "acme", "index_version": "v1",
                                             "chunks": [{"chunk_id": "n1#0", "text": "Alpha"},
                                                        {"chunk_id": "n1#1", "text": "one."}]})
        return httpx.Response(404, json={"error": "not_found", "message": "unknown document"})


def test_langchain_vector_store_writes_searches_and_reads():
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from qrag_client.langchain import QragVectorStore

    api = Api()
    store = QragVectorStore("http://qrag.test", "k", index="acme", batch_size=2, transport=httpx.MockTransport(api))
    assert store.embeddings is None
    ids = store.add_documents([Document(id="a", page_content="A.", metadata={"n": 1}), Document(page_content="B."),
                               Document(id="c", page_content="C.")])
    assert ids[0] == "a" and ids[2] == "c" and len(ids[1]) == 36  # ids honoured, a new UUID for the one without
    writes = [body for method, path, body in api.requests if method == "POST"]
    assert writes == [{"index": "acme", "documents": [{"id": "a", "text": "A.", "title": "", "metadata": {"n": 1}},
                                                      {"id": ids[1], "text": "B.", "title": "", "metadata": {}}]},
                      {"index": "acme", "documents": [{"id": "c", "text": "C.", "title": "", "metadata": {}}]}]
    assert [path for _, path, _ in api.requests].count("/v1/writes/w-1") == 2  # waited for each batch
    api.requests.clear()
    found = store.similarity_search_with_score("alpha", k=3, filter={"type": "eq", "key": "lang", "value": "en"},
                                               doc_ids=["n1", "n2"])
    assert api.requests[0][2] == {"query": "alpha", "k": 3, "index": "acme", "doc_ids": ["n1", "n2"],
                                  "filter": {"type": "eq", "key": "lang", "value": "en"}}
    assert found[0] == (Document(id="n1", page_content="Alpha one.", metadata={"lang": "en", "ref_doc_id": "d1"}), 0.9)
    # per call through a retriever: search_kwargs, and what invoke adds
    retriever = store.as_retriever(search_kwargs={"k": 2, "filter": {"type": "eq", "key": "lang", "value": "en"}})
    retriever.invoke("alpha")
    assert api.requests[-1][2]["k"] == 2 and api.requests[-1][2]["filter"]["key"] == "lang"
    # MMR over the server's vectors: the near-duplicate n2 gives way to the different n3
    assert [d.id for d in store.max_marginal_relevance_search("alpha", k=2, fetch_k=3, lambda_mult=0.5)] == ["n1", "n3"]
    assert api.requests[-1][2] == {"query": "alpha", "k": 3, "index": "acme", "include_vectors": True}
    assert [d.id for d in store.max_marginal_relevance_search("alpha", k=2, fetch_k=3, lambda_mult=1.0)] == ["n1", "n2"]
    assert store.get_by_ids(["n1", "missing"]) == [Document(id="n1", page_content="Alpha\n\none.",
                                                            metadata={"lang": "en"})]
    assert store.delete(["a", "c"]) is True and api.requests[-2][:3] == ("DELETE", "/v1/documents",
                                                                         {"ids": ["a", "c"], "index": "acme"})
    with pytest.raises(ValueError, match="give ids or filter"):
        store.delete()
    with pytest.raises(ValueError, match="takes no embedding"):
        QragVectorStore.from_texts(["x"], embedding=object(), url="http://qrag.test")


def test_langchain_vector_store_async_twins():
    pytest.importorskip("langchain_core")
    from qrag_client.langchain import QragVectorStore

    api = Api()
    store = QragVectorStore("http://qrag.test", "k", wait=False, transport=httpx.MockTransport(api))

    async def run():
        ids = await store.aadd_texts(["A."], [{"n": 1}], ids=["a"])
        hits = await store.asimilarity_search("alpha", k=1)
        mmr = await store.amax_marginal_relevance_search("alpha", k=2, fetch_k=3)
        got = await store.aget_by_ids(["n1", "nope"])
        await store.adelete(filter={"type": "eq", "key": "n", "value": 1})
        return ids, hits, mmr, got

    ids, hits, mmr, got = asyncio.run(run())
    assert ids == ["a"] and hits[0].id == "n1" and [d.id for d in mmr] == ["n1", "n3"] and [d.id for d in got] == ["n1"]
    assert not any(path.startswith("/v1/writes/") for _, path, _ in api.requests)  # wait=False: no polling
    assert api.requests[-1][2] == {"filter": {"type": "eq", "key": "n", "value": 1}}


def test_llamaindex_vector_store_maps_nodes_queries_and_deletes():
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
    from llama_index.core.vector_stores.types import (
        MetadataFilter,
        MetadataFilters,
        VectorStoreQuery,
        VectorStoreQueryMode,
    )

    from qrag_client.llamaindex import QragLlamaIndexVectorStore

    api = Api()
    store = QragLlamaIndexVectorStore("http://qrag.test", "k", transport=httpx.MockTransport(api))
    assert store.stores_text and not store.is_embedding_query
    node = TextNode(id_="n1", text="Alpha one.", metadata={"lang": "en"}, embedding=[0.1],
                    relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="d1")})
    assert store.add([node]) == ["n1"]
    assert api.requests[0][2] == {"documents": [{"id": "n1", "text": "Alpha one.", "title": "",
                                                 "metadata": {"lang": "en", "ref_doc_id": "d1"}}]}
    result = store.query(VectorStoreQuery(query_str="alpha", similarity_top_k=3, doc_ids=["d1"], node_ids=["n1", "n2"],
                                          filters=MetadataFilters(filters=[MetadataFilter(key="lang", value="en")]),
                                          mode=VectorStoreQueryMode.HYBRID, alpha=0.7))
    assert api.requests[-1][2] == {"query": "alpha", "k": 3, "bm25_alpha": 0.7, "doc_ids": ["n1", "n2"],
                                   "filter": {"type": "and", "filters": [
                                       {"type": "eq", "key": "lang", "value": "en"},
                                       {"type": "in", "key": "ref_doc_id", "value": ["d1"]}]}}
    first = result.nodes[0]
    assert (first.node_id, first.text, first.metadata, first.ref_doc_id) == ("n1", "Alpha one.", {"lang": "en"}, "d1")
    assert result.similarities == [0.9, 0.89, 0.5] and result.ids == ["n1", "n2", "n3"]
    store.delete("d1")
    assert api.requests[-2][2] == {"filter": {"type": "in", "key": "ref_doc_id", "value": ["d1"]}}
    store.delete_nodes(["n1"])
    assert api.requests[-2][2] == {"ids": ["n1"]}
    assert [n.node_id for n in store.get_nodes(["n1", "nope"])] == ["n1"]
    with pytest.raises(ValueError, match="no query_str"):
        store.query(VectorStoreQuery(query_embedding=[0.1], similarity_top_k=1))
    with pytest.raises(ValueError, match="'mmr' is not supported"):
        store.query(VectorStoreQuery(query_str="x", mode=VectorStoreQueryMode.MMR))
