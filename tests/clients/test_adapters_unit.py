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
    {"chunk_id": "for#1", "doc_id": "for", "title": "The for topic", "score": 0.7, "cosine": 0.7, "text": "The else clause.",
     "url": "https://docs.example/for", "metadata": {"group": "loops", "score": "clash"},
     "matched": [{"kind": "question", "text": "When does the else clause run?", "score": 0.7}]},
    {"chunk_id": "while#0", "doc_id": "while", "title": "", "score": 0.5, "text": "While loops. " * 80,
     "matched": [{"kind": "chunk", "text": "While loops.", "score": 0.5}]}],
    "index": "acme", "index_version": "v9", "mode": "default", "took_ms": 2.0}


def test_langchain_documents():
    pytest.importorskip("langchain_core")
    from qrag_client.langchain import to_documents

    d, w = to_documents(SearchResponse.model_validate(PAGE))
    assert (d.id, d.page_content) == ("for#1", "The else clause.")
    assert d.metadata["matched_question"] == "When does the else clause run?" and d.metadata["matched_kind"] == "question"
    assert (d.metadata["doc_id"], d.metadata["url"], d.metadata["index_version"]) == ("for", "https://docs.example/for", "v9")
    # the chunk's own fields sit beside ours; on a clash ours win and theirs stay whole under `metadata`
    assert d.metadata["group"] == "loops" and d.metadata["score"] == 0.7
    assert d.metadata["metadata"] == {"group": "loops", "score": "clash"}
    assert w.metadata["matched_question"] is None and w.metadata["url"] is None


def test_llamaindex_nodes_and_filters():
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import MetadataMode
    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

    from qrag_client.llamaindex import QragLlamaIndexRetriever, UnsupportedFilterError, to_nodes, to_qrag_filter

    n = to_nodes(SearchResponse.model_validate(PAGE))[0]
    assert (n.node.node_id, n.score, n.node.ref_doc_id) == ("for#1", 0.7, "for")
    llm_view = n.node.get_content(metadata_mode=MetadataMode.LLM)
    assert "The for topic" in llm_view and "0.7" not in llm_view and "v9" not in llm_view  # no scores for the LLM

    f = MetadataFilters(filters=[MetadataFilter(key="group", value="loops"),
                                 MetadataFilter(key="order", value=3, operator="<"),
                                 MetadataFilter(key="tags", value=["a"], operator="nin")])
    assert to_qrag_filter(f) == {"type": "and", "filters": [{"type": "eq", "key": "group", "value": "loops"},
                                                            {"type": "lt", "key": "order", "value": 3},
                                                            {"type": "nin", "key": "tags", "value": ["a"]}]}
    assert to_qrag_filter(MetadataFilters(filters=[MetadataFilter(key="a", value=1, operator="!=")])) == \
        {"type": "ne", "key": "a", "value": 1}
    assert to_qrag_filter(MetadataFilters(filters=[])) is None
    for bad, says in [(MetadataFilter(key="a", value="x", operator="text_match"), "'text_match' on 'a' is not supported"),
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
        async with Client(server) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            found = await c.call_tool("search", {"query": "else?"})
            by_chunk = await c.call_tool("fetch", {"id": "for#1"})
            by_doc = await c.call_tool("fetch", {"id": "for"})
            missing = await c.call_tool("fetch", {"id": "nope"})
            return tools, found, by_chunk, by_doc, missing

    tools, found, by_chunk, by_doc, missing = asyncio.run(run())
    assert set(tools) == {"search", "fetch"}
    assert list(tools["search"].input_schema["properties"]) == ["query"]  # one string, as connectors call it
    assert list(tools["fetch"].input_schema["properties"]) == ["id"]
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
