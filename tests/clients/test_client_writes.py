"""The write route through the client and its adapters, against a real served tenant (local Ray, Serve over
HTTP, FAISS, MiniLM): `writer` (a write key) over an index of its own, built once for this module
(`chunk`: no LLM, so the server embeds what is written without one) and emptied before each test that
needs it empty; `reader` (a read key) over another index. Checked: the client's upsert / delete /
write_status / wait_until_searchable, sync and async, and their typed errors (403, 404, 422); search's
include_vectors; LangChain's standard vector-store tests (langchain_tests' VectorStoreIntegrationTests,
sync and async) on QragVectorStore, its MMR and per-call filters; LlamaIndex's
VectorStoreIndex.from_vector_store(QragLlamaIndexVectorStore) with MetadataFilters, insert and delete;
`qrag docs add/status/delete`.

The write route ships in the same release as this client: a server without it fails these tests (404 or
405 on the route, or a tenants file without write scopes), they never skip.

Cost: one small build (two seed documents) and one Serve app, 1 to 3 minutes on a busy 2-core box, then a
write's round trip per test (each waits until its writes are searchable)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time

import httpx
import pytest
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from qrag_client import AsyncQragClient, QragClient, errors
from qrag_ray.runtime.ports import free_port
from support.corpus import write_jsonl
from support.indexes import shared_build

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS and Serve

MAX_K = 1000
# The seed documents give the index's metadata schema every field these tests write (one type per field);
# the module deletes them before the first test, so each test starts from an empty index.
SEED = [{"id": "seed-a", "text": "A seed document the tests delete first.",
         "metadata": {"id": 0, "some_other_field": "seed", "topic": "seed", "year": 2000, "ref_doc_id": "seed"}},
        {"id": "seed-b", "text": "Another seed document.", "metadata": {"topic": "seed", "year": 2001}}]
KEYS_DOC = {"id": "keys", "text": "Rotate the API keys every ninety days and revoke the old ones.",
            "title": "Key rotation", "url": "https://ops.example/keys", "metadata": {"topic": "security", "year": 2024}}
BACKUP_DOC = {"id": "backup/nightly", "text": "Back up the database every night and test a restore each month.",
              "title": "Backups", "metadata": {"topic": "operations", "year": 2021}}
_SERVER: dict = {}  # for the LangChain standard tests, whose fixtures read it


@pytest.fixture(scope="module")
def writes(local_ray, client_index, index_root, tmp_path_factory):
    """Serve with tenants `writer` (scope write, its own versioned root) and `reader` (scope read, client_index)."""
    from ray import serve

    from qrag_ray.index.versions import publish_version
    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import add_tenant

    base = index_root / "writable-base"
    shared_build({"input": str(write_jsonl(index_root / "writable.jsonl", SEED)), "build.output": str(base),
                  "shards": 1, "representation": "chunk", "faiss.factory": "Flat", "chunker.method": "token",
                  "chunker.size": 120, "chunker.overlap": 20})
    index = index_root / "writable"  # writes go to a versioned root: its versions are what the Writer publishes
    publish_version(index, base)
    tenants_file = tmp_path_factory.mktemp("writes-serve") / "tenants.yaml"
    keys = {"writer": add_tenant(tenants_file, "writer", index, scope="write"),
            "reader": add_tenant(tenants_file, "reader", client_index)}
    port = free_port()
    serve.shutdown()  # a Serve left in this session's Ray would keep its own port and ignore ours
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:  # Serve goes with the module even when its set-up fails: the next module needs the CPUs it holds
        small = {"ray_actor_options": {"num_cpus": 0.5}}
        options = {name: small for name in ("Router", "ShardSearcher0", "Writer")}
        serve.run(compose_app({"tenants": str(tenants_file)}, options), name="qrag-writes", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        while httpx.get(f"{url}/readyz", timeout=30).status_code != 200:
            assert time.time() < deadline, "the app did not become ready"
            time.sleep(1)
        info = {"url": url, "keys": keys}
        _SERVER.update(info)
        with writer(info) as client:
            client.wait_until_searchable(client.delete([d["id"] for d in SEED]), timeout=120)
        yield info
    finally:
        serve.shutdown()


def writer(server: dict, **options) -> QragClient:
    return QragClient(server["url"], server["keys"]["writer"], **options)


def empty(client: QragClient) -> None:
    """Delete every document the writer's index holds (a search for anything returns every chunk of an
    index this small), and wait until searches see it empty."""
    for _ in range(3):
        held = sorted({r.doc_id for r in client.search("anything at all", MAX_K).results})
        if not held:
            return
        client.wait_until_searchable(client.delete(held), timeout=120)
    raise AssertionError(f"the writer's index still holds {held}")


@pytest.fixture
def blank(writes):
    """The served tenants, the writer's index empty before and after the test."""
    with writer(writes) as client:
        empty(client)
    yield writes
    with writer(writes) as client:
        empty(client)


# ---------------------------------------------------------------------------------------- the client
def test_upsert_wait_search_replace_delete(blank):
    with writer(blank) as client:
        receipt = client.upsert([KEYS_DOC, BACKUP_DOC])
        assert (receipt.operation, receipt.status, receipt.documents, receipt.index) == ("upsert", "queued", 2,
                                                                                         "writer")
        done = client.wait_until_searchable(receipt, timeout=120)
        assert done.status == "searchable" and done.documents == 2 and done.chunks >= 2
        assert done.indexed == done.chunks and done.searchable_at >= done.submitted_at and done.error is None
        assert client.write_status(receipt.write_id).status == "searchable"
        page = client.search("how often should API keys be rotated?", 2)
        assert [r.doc_id for r in page.results] == ["keys", "backup/nightly"]
        top = page.results[0]
        assert (top.text, top.title, top.url, top.metadata) == (KEYS_DOC["text"], "Key rotation",
                                                                "https://ops.example/keys",
                                                                {"topic": "security", "year": 2024})
        assert client.document("backup/nightly").text == BACKUP_DOC["text"]
        # an existing id is replaced whole: the old text is gone from search and fetch
        replacement = {**KEYS_DOC, "text": "Keys never expire.", "metadata": {"year": 2025}}
        client.wait_until_searchable(client.upsert([replacement]), timeout=120)
        replaced = client.document("keys")
        assert replaced.text == "Keys never expire." and replaced.metadata == {"year": 2025}
        results = client.search("rotate the API keys", MAX_K).results
        assert results  # the replacement and the other document are still there
        assert all(r.text != KEYS_DOC["text"] for r in results)
        # delete by id, then by filter (its count is known once applied)
        client.wait_until_searchable(client.delete(["keys"]), timeout=120)
        with pytest.raises(errors.NotFoundError):
            client.document("keys")
        by_filter = client.delete(filter={"type": "lt", "key": "year", "value": 2022})
        assert by_filter.operation == "delete" and by_filter.documents is None
        assert client.wait_until_searchable(by_filter, timeout=120).documents == 1
        assert client.search("backups", MAX_K).results == []


def test_the_async_client_writes_and_waits(blank):
    async def run():
        async with AsyncQragClient(blank["url"], blank["keys"]["writer"]) as client:
            done = await client.wait_until_searchable(await client.upsert([KEYS_DOC]), timeout=120)
            found = await client.search("rotate keys", 1)
            gone = await client.wait_until_searchable(await client.delete(["keys"]), timeout=120)
            left = await client.search("rotate keys", 1)
            return done, found, gone, left

    done, found, gone, left = asyncio.run(run())
    assert done.status == gone.status == "searchable" and found.results[0].doc_id == "keys" and left.results == []


def test_search_returns_the_vectors_it_ranked_with(blank):
    with writer(blank) as client:
        client.wait_until_searchable(client.upsert([KEYS_DOC, BACKUP_DOC]), timeout=120)
        page = client.search("how often should API keys be rotated?", 2, include_vectors=True)
        plain = client.search("how often should API keys be rotated?", 2)
    assert page.query_vector is not None and len(page.query_vector) == 384
    assert len(page.results) == 2  # the checks below are not of an empty page
    assert [r.chunk_id for r in page.results] == [r.chunk_id for r in plain.results] and plain.query_vector is None
    for result in page.results:
        assert len(result.vector) == 384 and math.isclose(math.fsum(x * x for x in result.vector), 1.0, rel_tol=1e-4)
        # a chunk index scores a chunk by its one vector: the score is the two vectors' cosine
        assert math.fsum(q * x for q, x in zip(page.query_vector, result.vector, strict=True)) == \
            pytest.approx(result.score, abs=1e-4)


def test_write_errors_are_typed(blank):
    with QragClient(blank["url"], blank["keys"]["reader"]) as reader, writer(blank) as client:
        with pytest.raises(errors.PermissionDeniedError) as read_key:
            reader.upsert([KEYS_DOC])  # a read key on a write route
        assert read_key.value.kind == "forbidden"
        with pytest.raises(errors.PermissionDeniedError):
            client.upsert([KEYS_DOC], index="reader")  # another tenant's index
        with pytest.raises(errors.NotFoundError) as unknown:
            client.write_status("no-such-write")
        assert unknown.value.kind == "not_found"
        mine = client.upsert([KEYS_DOC])
        # only the key's own tenant's writes: another's is as unknown to it as no write (or refused)
        with pytest.raises((errors.NotFoundError, errors.PermissionDeniedError)):
            reader.write_status(mine.write_id)
        client.wait_until_searchable(mine, timeout=120)
        # a bad record (the third): its position and field named, nothing of its batch applied; the server
        # may refuse it at once (422) or fail the write; positions may count from 0 or 1
        batch = [{"id": "good", "text": "A good record."}, {"id": "fine", "text": "Another good one."},
                 {**BACKUP_DOC, "metadata": {"year": "last year"}}]
        with pytest.raises((errors.InvalidRequestError, errors.WriteFailedError)) as bad:
            client.wait_until_searchable(client.upsert(batch), timeout=120)
        if isinstance(bad.value, errors.InvalidRequestError):
            assert bad.value.kind == "invalid_document" and "year" in bad.value.message
            assert re.search(r"\b[23]\b", bad.value.message), bad.value.message
        else:
            assert bad.value.status.error.record in (2, 3) and "year" in (bad.value.status.error.field or "")
        for doc_id in ("good", "fine"):
            with pytest.raises(errors.NotFoundError):
                client.document(doc_id)


# ---------------------------------------------------------------------------------------- LangChain
class TestQragVectorStoreStandard(VectorStoreIntegrationTests):
    """langchain-tests' own vector-store contract, sync and async, on the writer's tenant. Every standard
    test runs as langchain-tests defines it: the server embeds with MiniLM (not the suite's fake
    embeddings, which the store has no use for), and MiniLM ranks the suite's texts as its assertions
    expect (a text nearest itself)."""

    pytestmark = [pytest.mark.asyncio(loop_scope="function"),  # its async tests; the sync ones may ignore it
                  pytest.mark.filterwarnings("ignore:.*marked with '@pytest.mark.asyncio' but it is not an async")]

    @pytest.fixture
    def vectorstore(self, blank):
        """An empty store (the `blank` fixture empties the index before and after each test)."""
        from qrag_client.langchain import QragVectorStore

        return QragVectorStore(_SERVER["url"], _SERVER["keys"]["writer"], wait_timeout=120)


def test_langchain_store_filters_mmr_and_retriever(blank):
    from langchain_core.documents import Document

    from qrag_client.langchain import QragVectorStore

    store = QragVectorStore(blank["url"], blank["keys"]["writer"], wait_timeout=120)
    near = "Rotate the API keys every ninety days."
    backup = "Back up the database nightly."
    ids = store.add_documents([Document(page_content=near, metadata={"topic": "security", "year": 2024}, id="k1"),
                               Document(page_content=near + " Revoke old keys.", metadata={"topic": "security"}),
                               Document(page_content=backup, metadata={"topic": "operations"})])
    assert ids[0] == "k1" and len(set(ids)) == 3
    question = "how often should API keys be rotated?"
    ranking = [d.id for d in store.similarity_search(question, k=3)]
    assert set(ranking[:2]) == set(ids[:2]) and ranking[2] == ids[2]
    operations = {"type": "eq", "key": "topic", "value": "operations"}
    scored = store.similarity_search_with_score(question, k=3, filter=operations)
    assert [(d.id, d.metadata) for d, _ in scored] == [(ids[2], {"topic": "operations"})]
    # MMR: the near-duplicate of the best match gives way to the different document
    diverse = [ranking[0], ids[2]]
    assert [d.id for d in store.max_marginal_relevance_search(question, k=2, fetch_k=3, lambda_mult=0.3)] == diverse
    awaited = asyncio.run(store.amax_marginal_relevance_search(question, k=2, fetch_k=3, lambda_mult=0.3))
    assert [d.id for d in awaited] == diverse
    security = {"type": "eq", "key": "topic", "value": "security"}
    retriever = store.as_retriever(search_kwargs={"k": 1, "filter": security})
    assert [d.id for d in retriever.invoke(question)] == ranking[:1]
    assert [d.id for d in retriever.invoke(question, k=2)] == ranking[:2]  # per call
    store.delete(filter={"type": "eq", "key": "topic", "value": "security"})
    assert [d.id for d in store.similarity_search(question, k=3)] == [ids[2]]


# ---------------------------------------------------------------------------------------- LlamaIndex
def test_llamaindex_vector_store_index_inserts_filters_and_deletes(blank):
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

    from qrag_client.llamaindex import QragLlamaIndexVectorStore

    store = QragLlamaIndexVectorStore(blank["url"], blank["keys"]["writer"], wait_timeout=120)
    index = VectorStoreIndex.from_vector_store(store, embed_model=MockEmbedding(embed_dim=1))
    index.insert(Document(text=KEYS_DOC["text"], id_="keys", metadata={"topic": "security"}))
    index.insert(Document(text=BACKUP_DOC["text"], id_="backup", metadata={"topic": "operations"}))
    question = "how often should API keys be rotated?"
    both = index.as_retriever(similarity_top_k=5).retrieve(question)
    assert [n.node.ref_doc_id for n in both] == ["keys", "backup"]
    assert both[0].node.text == KEYS_DOC["text"] and both[0].node.metadata == {"topic": "security"}
    assert both[0].score > both[1].score
    operations = MetadataFilters(filters=[MetadataFilter(key="topic", value="operations")])
    filtered = index.as_retriever(similarity_top_k=5, filters=operations).retrieve(question)
    assert [n.node.ref_doc_id for n in filtered] == ["backup"]
    assert [n.node.ref_doc_id for n in asyncio.run(index.as_retriever(similarity_top_k=5).aretrieve(question))] == \
        ["keys", "backup"]
    index.delete_ref_doc("keys")
    assert [n.node.ref_doc_id for n in index.as_retriever(similarity_top_k=5).retrieve(question)] == ["backup"]


# ---------------------------------------------------------------------------------------- qrag docs
def test_qrag_docs_add_status_delete(blank, tmp_path, capsys):
    from qrag_ray.cli import main

    docs_file = write_jsonl(tmp_path / "docs.jsonl", [KEYS_DOC, BACKUP_DOC])
    server = ["--url", blank["url"], "--key", blank["keys"]["writer"]]
    assert main(["docs", "add", str(docs_file), *server, "--wait", "--timeout", "120"]) == 0
    taken, searchable = capsys.readouterr().out.splitlines()
    write_id = taken.split("\t")[0]
    assert taken.split("\t")[1:] == ["queued", "upsert of 2 documents in 'writer'"]
    assert searchable.startswith(f"{write_id}\tsearchable\t")
    assert main(["docs", "status", write_id, *server, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "searchable"
    with writer(blank) as client:
        assert {r.doc_id for r in client.search("keys and backups", MAX_K).results} == {"keys", "backup/nightly"}
        assert main(["docs", "delete", "--id", "backup/nightly", *server, "--wait"]) == 0
        assert {r.doc_id for r in client.search("keys and backups", MAX_K).results} == {"keys"}
    capsys.readouterr()
    assert main(["docs", "add", str(docs_file), "--url", blank["url"], "--key", blank["keys"]["reader"]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: HTTP 403 forbidden: ") and len(err.strip().splitlines()) == 1
