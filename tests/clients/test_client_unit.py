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
from qrag_client import AsyncQragClient, QragClient, RetryPolicy, errors

PAGE = {"results": [{"chunk_id": "for#0", "doc_id": "for", "title": "The for topic", "score": 0.61, "cosine": 0.61,
                     "text": "The for statement iterates.",
                     "matched": [{"kind": "chunk", "text": "The for statement iterates.", "score": 0.58},
                                 {"kind": "question", "text": "When does the else clause run?", "score": 0.61}]}],
        "index": "acme", "index_version": "v1", "mode": "default", "took_ms": 3.5, "hypothetical": None,
        "timings": {"path": "router"}}


class Server:
    """Scripted answers, one per request (the last repeats), and every request it got."""

    def __init__(self, *answers: httpx.Response | Exception):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def api_error(status: int, kind: str, message: str = "no", headers: dict | None = None, **extra) -> httpx.Response:
    return httpx.Response(status, json={"error": kind, "message": message, **extra}, headers=headers)


def make_client(server: Server, **options) -> QragClient:
    api_key = options.pop("api_key", "k1")
    return QragClient("http://qrag.test:8000/", api_key=api_key, transport=httpx.MockTransport(server), **options)


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The client's sleeps between retries, recorded instead of slept."""
    got: list[float] = []
    monkeypatch.setattr(qrag_client.client.time, "sleep", got.append)

    async def asleep(seconds):
        got.append(seconds)

    monkeypatch.setattr(qrag_client.client.anyio, "sleep", asleep)
    return got


def test_search_sends_only_the_given_fields_and_returns_typed_results():
    server = Server(httpx.Response(200, json=PAGE))
    page = make_client(server).search("when?", 3, filter={"type": "eq", "key": "lang", "value": "en"},
                                      doc_ids=["for"])
    (request,) = server.requests
    assert request.method == "POST" and str(request.url) == "http://qrag.test:8000/v1/search"
    assert request.headers["authorization"] == "Bearer k1"
    assert request.headers["user-agent"].startswith("qrag-client/")
    assert json.loads(request.content) == {"query": "when?", "k": 3, "doc_ids": ["for"],
                                           "filter": {"type": "eq", "key": "lang", "value": "en"}}
    result = page.results[0]
    assert (result.chunk_id, result.score, result.metadata, result.url) == ("for#0", 0.61, {}, None)
    # the best match that is a generated question
    assert result.matched_question == "When does the else clause run?"
    assert page.model_dump(mode="json", exclude_unset=True) == PAGE  # nothing added, nothing lost


def test_fetch_routes_percent_encode_the_id_and_pass_the_index():
    chunk = {"chunk_id": "a/b#0", "doc_id": "a/b", "title": "", "text": "t", "url": None, "metadata": {},
             "questions": ["q?"], "index": "acme", "index_version": "v1"}
    server = Server(httpx.Response(200, json=chunk))
    got = make_client(server).chunk("a/b#0", index="acme")
    assert server.requests[0].url.raw_path == b"/v1/chunks/a%2Fb%230?index=acme" and got.questions == ["q?"]
    doc = {"doc_id": "a/b", "title": "T", "url": "https://x/a", "metadata": {"lang": "en"}, "index": "acme",
           "index_version": "v1", "chunks": [{"chunk_id": "a/b#0", "title": "T", "text": "one", "questions": []},
                                             {"chunk_id": "a/b#1", "title": "T", "text": "two", "questions": []}]}
    server = Server(httpx.Response(200, json=doc))
    document = make_client(server).document("a/b")
    assert server.requests[0].url.raw_path == b"/v1/documents/a%2Fb" and document.text == "one\n\ntwo"


def test_a_newer_servers_fields_are_kept():
    server = Server(httpx.Response(200, json={**PAGE, "new_field": 1}))
    assert make_client(server).search("q").model_extra == {"new_field": 1}


@pytest.mark.parametrize("status,cls,kind", [
    (400, errors.BadRequestError, "malformed_json"), (401, errors.AuthenticationError, "unauthorized"),
    (403, errors.PermissionDeniedError, "forbidden"), (404, errors.NotFoundError, "not_found"),
    (409, errors.ConflictError, "no_bm25_index"), (409, errors.ConflictError, "not_writable"),
    (413, errors.PayloadTooLargeError, "too_large"), (422, errors.InvalidRequestError, "invalid_filter"),
    (422, errors.InvalidRequestError, "invalid_document"), (429, errors.RateLimitError, "write_backlog"),
    (429, errors.RateLimitError, "rate_limited"), (501, errors.NotConfiguredError, "llm_not_configured"),
    (502, errors.UpstreamError, "llm_failed"), (503, errors.ServiceUnavailableError, "overloaded"),
    (504, errors.DeadlineExceededError, "deadline_exceeded"), (405, errors.QragAPIError, "method_not_allowed"),
])
def test_each_error_status_is_its_own_class(status, cls, kind):
    detail = [{"loc": ["body", "k"], "msg": "too big", "type": "less_than_equal"}] if status == 422 else None
    extra = {"detail": detail} if detail else {}
    server = Server(api_error(status, kind, "one line", headers={"Retry-After": "7"}, **extra))
    with pytest.raises(cls) as got:
        make_client(server, retry=qrag_client.NO_RETRIES).search("q")
    error = got.value
    assert type(error) is cls and isinstance(error, errors.QragClientError)
    assert (error.status, error.kind, error.message, error.detail, error.retry_after) == (
        status, kind, "one line", detail, 7.0)
    assert str(error) == f"HTTP {status} {kind}: one line"  # the line `qrag query` prints


@pytest.mark.parametrize("response,says", [
    (httpx.Response(502, text="<html>bad gateway</html>"), "answered HTTP 502 with a non-JSON body"),
    (httpx.Response(200, text="not json"), "answered HTTP 200 with a non-JSON body"),
    (httpx.Response(200, json={"results": "nope"}), "answered HTTP 200 with an unexpected body"),
    (httpx.Response(500, json={"detail": "Internal"}), "answered HTTP 500 with an unexpected body"),
    (httpx.Response(307, headers={"Location": "http://qrag.test:8000/v1/documents/"}),
     "answered HTTP 307, a redirect to http://qrag.test:8000/v1/documents/: does this server have the route?"),
])
def test_answers_that_are_not_the_apis_are_unexpected_responses(response, says):
    with pytest.raises(errors.UnexpectedResponseError, match=says):
        make_client(Server(response)).search("q")


def test_429_and_503_wait_their_retry_after_then_succeed(waits):
    server = Server(api_error(429, "rate_limited", headers={"Retry-After": "2"}),
                    api_error(503, "overloaded", headers={"Retry-After": "1"}), httpx.Response(200, json=PAGE))
    assert make_client(server).search("q").results[0].chunk_id == "for#0"
    assert waits == [2.0, 1.0] and len(server.requests) == 3


def test_retries_are_bounded_and_a_long_retry_after_is_not_waited_out(waits):
    server = Server(api_error(503, "shard_unavailable", headers={"Retry-After": "1"}))
    with pytest.raises(errors.ServiceUnavailableError):
        make_client(server, retry=RetryPolicy(max_retries=2)).search("q")
    assert waits == [1.0, 1.0] and len(server.requests) == 3
    waits.clear()
    server = Server(api_error(429, "rate_limited", headers={"Retry-After": "120"}))
    with pytest.raises(errors.RateLimitError) as got:
        make_client(server, retry=RetryPolicy(max_wait_s=30)).search("q")
    assert waits == [] and len(server.requests) == 1 and got.value.retry_after == 120.0


def test_503_without_retry_after_backs_off(waits):
    server = Server(api_error(503, "index_unavailable"), api_error(503, "index_unavailable"),
                    httpx.Response(200, json=PAGE))
    make_client(server, retry=RetryPolicy(backoff_s=0.25)).search("q")
    assert waits == [0.25, 0.5]


@pytest.mark.parametrize("status,kind", [(422, "invalid_request"), (401, "unauthorized"), (502, "llm_failed"),
                                         (504, "deadline_exceeded")])
def test_other_errors_are_not_retried(waits, status, kind):
    server = Server(api_error(status, kind))
    with pytest.raises(errors.QragAPIError):
        make_client(server).answer("q")
    assert len(server.requests) == 1 and waits == []


def test_a_connection_never_made_is_retried_a_timeout_is_not(waits):
    server = Server(httpx.ConnectError("refused"), httpx.Response(200, json=PAGE))
    assert make_client(server).search("q").index == "acme"
    assert len(server.requests) == 2 and waits == [0.5]
    server = Server(httpx.ReadTimeout("slow"))
    timed_out = "cannot reach http://qrag.test:8000: no answer within the timeout"
    with pytest.raises(errors.QragTimeoutError, match=timed_out):
        make_client(server).search("q")
    assert len(server.requests) == 1
    server = Server(httpx.ConnectError("refused"))
    with pytest.raises(errors.QragConnectionError, match="cannot reach http://qrag.test:8000: refused") as got:
        make_client(server, retry=RetryPolicy(max_retries=1)).search("q")
    assert got.value.nothing_sent and len(server.requests) == 2


def test_the_timeout_reaches_httpx():
    client = QragClient("http://qrag.test", timeout=1.5)
    assert client._http.timeout.read == 1.5
    client.close()


def test_no_key_sends_no_authorization():
    server = Server(httpx.Response(200, json={"indexes": []}))
    make_client(server, api_key=None).indexes()
    assert "authorization" not in server.requests[0].headers


def test_the_async_client_does_the_same(waits):
    server = Server(api_error(429, "rate_limited", headers={"Retry-After": "1"}), httpx.Response(200, json=PAGE),
                    api_error(404, "not_found", "unknown chunk"))

    async def run():
        async with AsyncQragClient("http://qrag.test", api_key="k2", transport=httpx.MockTransport(server)) as client:
            page = await client.search("q", 1)
            with pytest.raises(errors.NotFoundError, match="HTTP 404 not_found: unknown chunk"):
                await client.chunk("x#0")
            return page

    page = asyncio.run(run())
    assert page.results[0].chunk_id == "for#0" and waits == [1.0]
    assert [r.url.raw_path for r in server.requests] == [b"/v1/search", b"/v1/search", b"/v1/chunks/x%230"]
    assert server.requests[0].headers["authorization"] == "Bearer k2"


def test_unknown_request_fields_fail_in_the_client():
    with pytest.raises(TypeError):
        make_client(Server(httpx.Response(200, json=PAGE))).search("q", min_socre=0.3)



# ---------------------------------------------------------------------------------------- writes
RECEIPT = {"write_id": "w-1", "index": "acme", "operation": "upsert", "status": "queued", "documents": 2}


def status(state: str, **extra) -> httpx.Response:
    return httpx.Response(200, json={"write_id": "w-1", "index": "acme", "operation": "upsert", "status": state,
                                     "documents": 2, "chunks": 3, "indexed": 3 if state == "searchable" else 1,
                                     "submitted_at": 1.0, "searchable_at": 2.0 if state == "searchable" else None,
                                     "error": None, **extra})


def test_upsert_sends_the_documents_and_returns_the_receipt():
    server = Server(httpx.Response(202, json=RECEIPT))
    records = [{"id": "a", "text": "Alpha.", "metadata": {"lang": "en", "year": 2021}},
               qrag_client.Document(id="b/1", text="Beta.", title="B", url="https://x/b")]
    got = make_client(server).upsert(records, index="acme")
    (request,) = server.requests
    assert (request.method, request.url.raw_path) == ("POST", b"/v1/documents")
    assert json.loads(request.content) == {"index": "acme", "documents": [
        {"id": "a", "text": "Alpha.", "title": "", "metadata": {"lang": "en", "year": 2021}},
        {"id": "b/1", "text": "Beta.", "title": "B", "url": "https://x/b", "metadata": {}}]}
    assert (got.write_id, got.operation, got.status, got.documents) == ("w-1", "upsert", "queued", 2)


@pytest.mark.parametrize("records", [[{"id": "", "text": "x"}], [{"id": "a", "text": ""}], [{"text": "x"}],
                                     [{"id": "a", "text": "x", "questions": ["q?"]}], []])
def test_a_record_the_client_can_tell_is_invalid_is_refused_before_sending(records):
    server = Server(httpx.Response(202, json=RECEIPT))
    with pytest.raises(ValueError):
        make_client(server).upsert(records)
    assert server.requests == []


def test_delete_by_ids_or_by_filter_and_exactly_one():
    server = Server(httpx.Response(202, json=RECEIPT | {"operation": "delete", "documents": None}))
    client = make_client(server)
    client.delete(["a", "b/1"])
    got = client.delete(filter=qrag_client.ComparisonFilter(type="lt", key="year", value=2000))
    assert [(r.method, r.url.raw_path, json.loads(r.content)) for r in server.requests] == [
        ("DELETE", b"/v1/documents", {"ids": ["a", "b/1"]}),
        ("DELETE", b"/v1/documents", {"filter": {"type": "lt", "key": "year", "value": 2000}})]
    assert got.operation == "delete" and got.documents is None  # a filter's count is known later
    for bad in ({}, {"ids": ["a"], "filter": {"type": "eq", "key": "a", "value": 1}}):
        with pytest.raises(ValueError, match="exactly one of ids and filter"):
            client.delete(**bad)
    assert len(server.requests) == 2


def test_wait_until_searchable_polls_the_write_status(waits):
    server = Server(status("queued"), status("indexing"), status("searchable"))
    got = make_client(server).wait_until_searchable(qrag_client.WriteReceipt.model_validate(RECEIPT), poll=0.25)
    assert got.status == "searchable" and got.searchable_at == 2.0 and got.indexed == got.chunks == 3
    assert [r.url.raw_path for r in server.requests] == [b"/v1/writes/w-1"] * 3 and waits == [0.25, 0.25]


def test_a_failed_write_raises_its_reason_and_a_slow_one_times_out(waits):
    failure = {"record": 1, "field": "metadata.year", "message": "is a string, the index has it as a number"}
    server = Server(status("failed", error=failure))
    with pytest.raises(errors.WriteFailedError) as got:
        make_client(server).wait_until_searchable("w-1")
    assert str(got.value) == ("write w-1 to 'acme' failed: record 1, field 'metadata.year': is a string, the index "
                              "has it as a number")
    assert got.value.status.error.record == 1
    server = Server(status("indexing"))
    with pytest.raises(errors.WriteTimeoutError) as late:
        make_client(server).wait_until_searchable("w-1", timeout=0)
    assert isinstance(late.value, TimeoutError) and isinstance(late.value, errors.QragClientError)
    assert "still indexing after 0 s (1 of 3 chunks indexed)" in str(late.value) and late.value.status.indexed == 1


def test_write_ids_are_one_path_segment_and_an_unknown_one_is_a_404():
    server = Server(api_error(404, "not_found", "unknown write 'a/b'"))
    with pytest.raises(errors.NotFoundError):
        make_client(server).write_status("a/b")
    assert server.requests[0].url.raw_path == b"/v1/writes/a%2Fb"


def test_a_write_backlog_waits_its_retry_after(waits):
    server = Server(api_error(429, "write_backlog", headers={"Retry-After": "3"}),
                    httpx.Response(202, json=RECEIPT))
    assert make_client(server).upsert([{"id": "a", "text": "t"}]).write_id == "w-1"
    assert waits == [3.0] and len(server.requests) == 2


def test_the_nested_error_body_reads_the_same():
    server = Server(httpx.Response(403, json={"error": {"kind": "forbidden", "message": "a read key cannot write"}}))
    with pytest.raises(errors.PermissionDeniedError) as got:
        make_client(server, retry=qrag_client.NO_RETRIES).upsert([{"id": "a", "text": "t"}])
    assert (got.value.kind, got.value.message) == ("forbidden", "a read key cannot write")


def test_include_vectors_asks_for_and_returns_the_vectors():
    page = {**PAGE, "query_vector": [0.6, 0.8], "results": [{**PAGE["results"][0], "vector": [1.0, 0.0]}]}
    server = Server(httpx.Response(200, json=page))
    got = make_client(server).search("q", 1, include_vectors=True)
    assert json.loads(server.requests[0].content) == {"query": "q", "k": 1, "include_vectors": True}
    assert got.query_vector == [0.6, 0.8] and got.results[0].vector == [1.0, 0.0]
    server = Server(httpx.Response(200, json=PAGE))
    plain = make_client(server).search("q")
    assert "include_vectors" not in json.loads(server.requests[0].content) and plain.query_vector is None
    with pytest.raises(TypeError):  # /v1/answer takes no vectors
        make_client(server).answer("q", include_vectors=True)


def test_the_async_client_writes_and_waits(waits):
    server = Server(httpx.Response(202, json=RECEIPT), status("indexing"), status("searchable"),
                    httpx.Response(202, json=RECEIPT | {"operation": "delete", "documents": 1}))

    async def run():
        async with AsyncQragClient("http://qrag.test", api_key="k2", transport=httpx.MockTransport(server)) as client:
            receipt = await client.upsert([{"id": "a", "text": "t"}])
            done = await client.wait_until_searchable(receipt, poll=0.1)
            gone = await client.delete(["a"])
            return done, gone

    done, gone = asyncio.run(run())
    assert done.status == "searchable" and gone.operation == "delete" and waits == [0.1]
    assert [(r.method, r.url.raw_path) for r in server.requests] == [
        ("POST", b"/v1/documents"), ("GET", b"/v1/writes/w-1"), ("GET", b"/v1/writes/w-1"),
        ("DELETE", b"/v1/documents")]
