"""The light client (clients/python) without a server: requests it sends, the API's error bodies as typed
exceptions, timeouts, and the retry policy (429/503 honouring Retry-After, a connection never made),
sync and async. The server side is an httpx.MockTransport: the HTTP boundary, answered as the API does
(its bodies and headers); tests/clients/test_client_server.py runs the same client against a real one."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

import qrag_client
from qrag_client import AsyncQragClient, QragClient, RetryPolicy
from qrag_client import errors as e

PAGE = {"results": [{"chunk_id": "for#0", "doc_id": "for", "title": "The for topic", "score": 0.61, "cosine": 0.61,
                     "text": "The for statement iterates.",
                     "matched": [{"kind": "chunk", "text": "The for statement iterates.", "score": 0.58},
                                 {"kind": "question", "text": "When does the else clause run?", "score": 0.61}]}],
        "index": "acme", "index_version": "v1", "mode": "default", "took_ms": 3.5, "hypothetical": None,
        "timings": {"path": "router"}}


class Server:
    """Scripted answers, one per request (the last repeats), and every request it got."""

    def __init__(self, *answers: httpx.Response | Exception):
        self.answers, self.requests = list(answers), []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(a, Exception):
            raise a
        return a


def err(status: int, kind: str, message: str = "no", headers: dict | None = None, **extra) -> httpx.Response:
    return httpx.Response(status, json={"error": kind, "message": message, **extra}, headers=headers)


def client(server: Server, **kw) -> QragClient:
    return QragClient("http://qrag.test:8000/", api_key=kw.pop("api_key", "k1"), transport=httpx.MockTransport(server),
                      **kw)


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The client's sleeps between retries, recorded instead of slept."""
    got: list[float] = []
    monkeypatch.setattr(qrag_client.client.time, "sleep", got.append)

    async def asleep(s):
        got.append(s)

    monkeypatch.setattr(qrag_client.client.anyio, "sleep", asleep)
    return got


def test_search_sends_only_the_given_fields_and_returns_typed_results():
    s = Server(httpx.Response(200, json=PAGE))
    page = client(s).search("when?", 3, filter={"type": "eq", "key": "lang", "value": "en"}, doc_ids=["for"])
    (req,) = s.requests
    assert req.method == "POST" and str(req.url) == "http://qrag.test:8000/v1/search"
    assert req.headers["authorization"] == "Bearer k1" and req.headers["user-agent"].startswith("qrag-client/")
    assert json.loads(req.content) == {"query": "when?", "k": 3, "doc_ids": ["for"],
                                       "filter": {"type": "eq", "key": "lang", "value": "en"}}
    r = page.results[0]
    assert (r.chunk_id, r.score, r.metadata, r.url) == ("for#0", 0.61, {}, None)
    assert r.matched_question == "When does the else clause run?"  # the best match that is a generated question
    assert page.model_dump(mode="json", exclude_unset=True) == PAGE  # nothing added, nothing lost


def test_fetch_routes_percent_encode_the_id_and_pass_the_index():
    chunk = {"chunk_id": "a/b#0", "doc_id": "a/b", "title": "", "text": "t", "url": None, "metadata": {},
             "questions": ["q?"], "index": "acme", "index_version": "v1"}
    s = Server(httpx.Response(200, json=chunk))
    got = client(s).chunk("a/b#0", index="acme")
    assert s.requests[0].url.raw_path == b"/v1/chunks/a%2Fb%230?index=acme" and got.questions == ["q?"]
    doc = {"doc_id": "a/b", "title": "T", "url": "https://x/a", "metadata": {"lang": "en"}, "index": "acme",
           "index_version": "v1", "chunks": [{"chunk_id": "a/b#0", "title": "T", "text": "one", "questions": []},
                                             {"chunk_id": "a/b#1", "title": "T", "text": "two", "questions": []}]}
    s = Server(httpx.Response(200, json=doc))
    d = client(s).document("a/b")
    assert s.requests[0].url.raw_path == b"/v1/documents/a%2Fb" and d.text == "one\n\ntwo"


def test_a_newer_servers_fields_are_kept():
    s = Server(httpx.Response(200, json={**PAGE, "new_field": 1}))
    assert client(s).search("q").model_extra == {"new_field": 1}


@pytest.mark.parametrize("status,cls,kind", [
    (400, e.BadRequestError, "malformed_json"), (401, e.AuthenticationError, "unauthorized"),
    (403, e.PermissionDeniedError, "forbidden"), (404, e.NotFoundError, "not_found"),
    (409, e.ConflictError, "no_bm25_index"), (409, e.ConflictError, "not_writable"),
    (413, e.PayloadTooLargeError, "too_large"), (422, e.InvalidRequestError, "invalid_filter"),
    (422, e.InvalidRequestError, "invalid_document"), (429, e.RateLimitError, "write_backlog"),
    (429, e.RateLimitError, "rate_limited"), (501, e.NotConfiguredError, "llm_not_configured"),
    (502, e.UpstreamError, "llm_failed"), (503, e.ServiceUnavailableError, "overloaded"),
    (504, e.DeadlineExceededError, "deadline_exceeded"), (405, e.QragAPIError, "method_not_allowed"),
])
def test_each_error_status_is_its_own_class(status, cls, kind):
    detail = [{"loc": ["body", "k"], "msg": "too big", "type": "less_than_equal"}] if status == 422 else None
    s = Server(err(status, kind, "one line", headers={"Retry-After": "7"}, **({"detail": detail} if detail else {})))
    with pytest.raises(cls) as got:
        client(s, retry=qrag_client.NO_RETRIES).search("q")
    x = got.value
    assert type(x) is cls and isinstance(x, e.QragClientError)
    assert (x.status, x.kind, x.message, x.detail, x.retry_after) == (status, kind, "one line", detail, 7.0)
    assert str(x) == f"HTTP {status} {kind}: one line"  # the line `qrag query` prints


@pytest.mark.parametrize("response,says", [
    (httpx.Response(502, text="<html>bad gateway</html>"), "answered HTTP 502 with a non-JSON body"),
    (httpx.Response(200, text="not json"), "answered HTTP 200 with a non-JSON body"),
    (httpx.Response(200, json={"results": "nope"}), "answered HTTP 200 with an unexpected body"),
    (httpx.Response(500, json={"detail": "Internal"}), "answered HTTP 500 with an unexpected body"),
    (httpx.Response(307, headers={"Location": "http://qrag.test:8000/v1/documents/"}),
     "answered HTTP 307, a redirect to http://qrag.test:8000/v1/documents/: does this server have the route?"),
])
def test_answers_that_are_not_the_apis_are_unexpected_responses(response, says):
    with pytest.raises(e.UnexpectedResponseError, match=says):
        client(Server(response)).search("q")


def test_429_and_503_wait_their_retry_after_then_succeed(waits):
    s = Server(err(429, "rate_limited", headers={"Retry-After": "2"}),
               err(503, "overloaded", headers={"Retry-After": "1"}), httpx.Response(200, json=PAGE))
    assert client(s).search("q").results[0].chunk_id == "for#0"
    assert waits == [2.0, 1.0] and len(s.requests) == 3


def test_retries_are_bounded_and_a_long_retry_after_is_not_waited_out(waits):
    s = Server(err(503, "shard_unavailable", headers={"Retry-After": "1"}))
    with pytest.raises(e.ServiceUnavailableError):
        client(s, retry=RetryPolicy(max_retries=2)).search("q")
    assert waits == [1.0, 1.0] and len(s.requests) == 3
    waits.clear()
    s = Server(err(429, "rate_limited", headers={"Retry-After": "120"}))
    with pytest.raises(e.RateLimitError) as got:
        client(s, retry=RetryPolicy(max_wait_s=30)).search("q")
    assert waits == [] and len(s.requests) == 1 and got.value.retry_after == 120.0


def test_503_without_retry_after_backs_off(waits):
    s = Server(err(503, "index_unavailable"), err(503, "index_unavailable"), httpx.Response(200, json=PAGE))
    client(s, retry=RetryPolicy(backoff_s=0.25)).search("q")
    assert waits == [0.25, 0.5]


@pytest.mark.parametrize("status,kind", [(422, "invalid_request"), (401, "unauthorized"), (502, "llm_failed"),
                                         (504, "deadline_exceeded")])
def test_other_errors_are_not_retried(waits, status, kind):
    s = Server(err(status, kind))
    with pytest.raises(e.QragAPIError):
        client(s).answer("q")
    assert len(s.requests) == 1 and waits == []


def test_a_connection_never_made_is_retried_a_timeout_is_not(waits):
    s = Server(httpx.ConnectError("refused"), httpx.Response(200, json=PAGE))
    assert client(s).search("q").index == "acme"
    assert len(s.requests) == 2 and waits == [0.5]
    s = Server(httpx.ReadTimeout("slow"))
    with pytest.raises(e.QragTimeoutError, match="cannot reach http://qrag.test:8000: no answer within the timeout"):
        client(s).search("q")
    assert len(s.requests) == 1
    s = Server(httpx.ConnectError("refused"))
    with pytest.raises(e.QragConnectionError, match="cannot reach http://qrag.test:8000: refused") as got:
        client(s, retry=RetryPolicy(max_retries=1)).search("q")
    assert got.value.nothing_sent and len(s.requests) == 2


def test_the_timeout_reaches_httpx():
    c = QragClient("http://qrag.test", timeout=1.5)
    assert c._http.timeout.read == 1.5
    c.close()


def test_no_key_sends_no_authorization():
    s = Server(httpx.Response(200, json={"indexes": []}))
    client(s, api_key=None).indexes()
    assert "authorization" not in s.requests[0].headers


def test_the_async_client_does_the_same(waits):
    s = Server(err(429, "rate_limited", headers={"Retry-After": "1"}), httpx.Response(200, json=PAGE),
               err(404, "not_found", "unknown chunk"))

    async def run():
        async with AsyncQragClient("http://qrag.test", api_key="k2", transport=httpx.MockTransport(s)) as c:
            page = await c.search("q", 1)
            with pytest.raises(e.NotFoundError, match="HTTP 404 not_found: unknown chunk"):
                await c.chunk("x#0")
            return page

    page = asyncio.run(run())
    assert page.results[0].chunk_id == "for#0" and waits == [1.0]
    assert [r.url.raw_path for r in s.requests] == [b"/v1/search", b"/v1/search", b"/v1/chunks/x%230"]
    assert s.requests[0].headers["authorization"] == "Bearer k2"


def test_unknown_request_fields_fail_in_the_client():
    with pytest.raises(TypeError):
        client(Server(httpx.Response(200, json=PAGE))).search("q", min_socre=0.3)



# ---------------------------------------------------------------------------------------- writes
RECEIPT = {"write_id": "w-1", "index": "acme", "operation": "upsert", "status": "queued", "documents": 2}


def status(state: str, **extra) -> httpx.Response:
    return httpx.Response(200, json={"write_id": "w-1", "index": "acme", "operation": "upsert", "status": state,
                                     "documents": 2, "chunks": 3, "indexed": 3 if state == "searchable" else 1,
                                     "submitted_at": 1.0, "searchable_at": 2.0 if state == "searchable" else None,
                                     "error": None, **extra})


def test_upsert_sends_the_documents_and_returns_the_receipt():
    s = Server(httpx.Response(202, json=RECEIPT))
    got = client(s).upsert([{"id": "a", "text": "Alpha.", "metadata": {"lang": "en", "year": 2021}},
                            qrag_client.Document(id="b/1", text="Beta.", title="B", url="https://x/b")], index="acme")
    (req,) = s.requests
    assert (req.method, req.url.raw_path) == ("POST", b"/v1/documents")
    assert json.loads(req.content) == {"index": "acme", "documents": [
        {"id": "a", "text": "Alpha.", "title": "", "metadata": {"lang": "en", "year": 2021}},
        {"id": "b/1", "text": "Beta.", "title": "B", "url": "https://x/b", "metadata": {}}]}
    assert (got.write_id, got.operation, got.status, got.documents) == ("w-1", "upsert", "queued", 2)


@pytest.mark.parametrize("records", [[{"id": "", "text": "x"}], [{"id": "a", "text": ""}], [{"text": "x"}],
                                     [{"id": "a", "text": "x", "questions": ["q?"]}], []])
def test_a_record_the_client_can_tell_is_invalid_is_refused_before_sending(records):
    s = Server(httpx.Response(202, json=RECEIPT))
    with pytest.raises(ValueError):
        client(s).upsert(records)
    assert s.requests == []


def test_delete_by_ids_or_by_filter_and_exactly_one():
    s = Server(httpx.Response(202, json=RECEIPT | {"operation": "delete", "documents": None}))
    c = client(s)
    c.delete(["a", "b/1"])
    got = c.delete(filter=qrag_client.ComparisonFilter(type="lt", key="year", value=2000))
    assert [(r.method, r.url.raw_path, json.loads(r.content)) for r in s.requests] == [
        ("DELETE", b"/v1/documents", {"ids": ["a", "b/1"]}),
        ("DELETE", b"/v1/documents", {"filter": {"type": "lt", "key": "year", "value": 2000}})]
    assert got.operation == "delete" and got.documents is None  # a filter's count is known later
    for bad in ({}, {"ids": ["a"], "filter": {"type": "eq", "key": "a", "value": 1}}):
        with pytest.raises(ValueError, match="exactly one of ids and filter"):
            c.delete(**bad)
    assert len(s.requests) == 2


def test_wait_until_searchable_polls_the_write_status(waits):
    s = Server(status("queued"), status("indexing"), status("searchable"))
    got = client(s).wait_until_searchable(qrag_client.WriteReceipt.model_validate(RECEIPT), poll=0.25)
    assert got.status == "searchable" and got.searchable_at == 2.0 and got.indexed == got.chunks == 3
    assert [r.url.raw_path for r in s.requests] == [b"/v1/writes/w-1"] * 3 and waits == [0.25, 0.25]


def test_a_failed_write_raises_its_reason_and_a_slow_one_times_out(waits):
    failure = {"record": 1, "field": "metadata.year", "message": "is a string, the index has it as a number"}
    s = Server(status("failed", error=failure))
    with pytest.raises(e.WriteFailedError) as got:
        client(s).wait_until_searchable("w-1")
    assert str(got.value) == ("write w-1 to 'acme' failed: record 1, field 'metadata.year': is a string, the index "
                              "has it as a number")
    assert got.value.status.error.record == 1
    s = Server(status("indexing"))
    with pytest.raises(e.WriteTimeoutError) as late:
        client(s).wait_until_searchable("w-1", timeout=0)
    assert isinstance(late.value, TimeoutError) and isinstance(late.value, e.QragClientError)
    assert "still indexing after 0 s (1 of 3 chunks indexed)" in str(late.value) and late.value.status.indexed == 1


def test_write_ids_are_one_path_segment_and_an_unknown_one_is_a_404():
    s = Server(err(404, "not_found", "unknown write 'a/b'"))
    with pytest.raises(e.NotFoundError):
        client(s).write_status("a/b")
    assert s.requests[0].url.raw_path == b"/v1/writes/a%2Fb"


def test_a_write_backlog_waits_its_retry_after(waits):
    s = Server(err(429, "write_backlog", headers={"Retry-After": "3"}), httpx.Response(202, json=RECEIPT))
    assert client(s).upsert([{"id": "a", "text": "t"}]).write_id == "w-1"
    assert waits == [3.0] and len(s.requests) == 2


def test_the_nested_error_body_reads_the_same():
    s = Server(httpx.Response(403, json={"error": {"kind": "forbidden", "message": "a read key cannot write"}}))
    with pytest.raises(e.PermissionDeniedError) as got:
        client(s, retry=qrag_client.NO_RETRIES).upsert([{"id": "a", "text": "t"}])
    assert (got.value.kind, got.value.message) == ("forbidden", "a read key cannot write")


def test_include_vectors_asks_for_and_returns_the_vectors():
    page = {**PAGE, "query_vector": [0.6, 0.8], "results": [{**PAGE["results"][0], "vector": [1.0, 0.0]}]}
    s = Server(httpx.Response(200, json=page))
    got = client(s).search("q", 1, include_vectors=True)
    assert json.loads(s.requests[0].content) == {"query": "q", "k": 1, "include_vectors": True}
    assert got.query_vector == [0.6, 0.8] and got.results[0].vector == [1.0, 0.0]
    s = Server(httpx.Response(200, json=PAGE))
    plain = client(s).search("q")
    assert "include_vectors" not in json.loads(s.requests[0].content) and plain.query_vector is None
    with pytest.raises(TypeError):  # /v1/answer takes no vectors
        client(s).answer("q", include_vectors=True)


def test_the_async_client_writes_and_waits(waits):
    s = Server(httpx.Response(202, json=RECEIPT), status("indexing"), status("searchable"),
               httpx.Response(202, json=RECEIPT | {"operation": "delete", "documents": 1}))

    async def run():
        async with AsyncQragClient("http://qrag.test", api_key="k2", transport=httpx.MockTransport(s)) as c:
            receipt = await c.upsert([{"id": "a", "text": "t"}])
            done = await c.wait_until_searchable(receipt, poll=0.1)
            gone = await c.delete(["a"])
            return done, gone

    done, gone = asyncio.run(run())
    assert done.status == "searchable" and gone.operation == "delete" and waits == [0.1]
    assert [(r.method, r.url.raw_path) for r in s.requests] == [
        ("POST", b"/v1/documents"), ("GET", b"/v1/writes/w-1"), ("GET", b"/v1/writes/w-1"),
        ("DELETE", b"/v1/documents")]
