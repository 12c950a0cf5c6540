"""QragClient and AsyncQragClient: the API's routes over httpx, typed results, typed errors, a timeout
on every request, and bounded retries on 429 and 503, waiting what the server's Retry-After says, and on
a connection that could not be made (nothing was sent). Reads repeat nothing; a write is keyed by its
documents' ids (an upsert replaces them whole, a delete removes them), so a retried one that had been
taken after all applies the same change twice, which leaves the same index."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote

import anyio
import httpx
from pydantic import BaseModel, ValidationError

from qrag_client import __version__
from qrag_client.errors import (
    QragClientError,
    QragConnectionError,
    QragTimeoutError,
    RateLimitError,
    ServiceUnavailableError,
    UnexpectedResponseError,
    WriteFailedError,
    WriteTimeoutError,
    error_from_response,
)
from qrag_client.models import (
    AnswerRequest,
    AnswerResponse,
    ChunkResponse,
    DeleteRequest,
    Document,
    DocumentResponse,
    Filter,
    IndexesResponse,
    SearchRequest,
    SearchResponse,
    UpsertRequest,
    WriteReceipt,
    WriteStatus,
)

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class RetryPolicy:
    """At most `max_retries` retries of one call. A 429 or 503 waits its Retry-After (else `backoff_s`
    doubling per retry); a wait longer than `max_wait_s` is not waited out: the error is raised at once,
    so a caller is never held longer than it agreed to. Other errors are raised at once: a 4xx is the
    request's fault, 502/504 would likely fail again at full cost."""

    max_retries: int = 2
    backoff_s: float = 0.5
    max_wait_s: float = 30.0

    def delay(self, attempt: int, error: QragClientError) -> float | None:
        """Seconds to wait before retrying after `error` on try `attempt` (0-based), or None: raise it."""
        if attempt >= self.max_retries:
            return None
        if isinstance(error, (RateLimitError, ServiceUnavailableError)):
            wait = error.retry_after if error.retry_after is not None else self.backoff_s * 2 ** attempt
        elif isinstance(error, QragConnectionError) and error.nothing_sent:
            wait = self.backoff_s * 2 ** attempt
        else:
            return None
        return wait if wait <= self.max_wait_s else None


NO_RETRIES = RetryPolicy(max_retries=0)


class _Call(NamedTuple):
    method: str
    path: str
    body: dict[str, Any] | None
    params: dict[str, str] | None
    model: type[BaseModel]


FilterArg = Mapping[str, Any] | BaseModel | None  # the grammar as a dict, or as qrag_client.models' filter models


def quote_id(value: str) -> str:
    """An id as one path segment: chunk ids hold '#', document ids may hold '/'."""
    return quote(value, safe="")


class _Routes:
    """The API's routes, shared by both clients: each builds its call and hands it to `_run`, which
    returns the result (QragClient) or a coroutine of it (AsyncQragClient: `await client.search(...)`)."""

    def _run(self, call: _Call) -> Any:
        raise NotImplementedError

    def search(self, query: str, k: int | None = None, *, filter: FilterArg = None,
               doc_ids: list[str] | None = None, mode: str | None = None, min_score: float | None = None,
               index: str | None = None, bm25_alpha: float | None = None,
               include_vectors: bool | None = None) -> SearchResponse:
        """POST /v1/search: the top k distinct chunks (the server's default k when None). `include_vectors`:
        the query's vector and each chunk's (its best-matching row's), L2-normalised, for re-ranking here."""
        request = SearchRequest(query=query, k=k, filter=_filter(filter), doc_ids=doc_ids, mode=mode,
                                min_score=min_score, index=index, bm25_alpha=bm25_alpha,
                                include_vectors=include_vectors)
        return self._run(_Call("POST", "/v1/search", request.body(), None, SearchResponse))

    def answer(self, query: str, k: int | None = None, *, max_tokens: int | None = None,
               filter: FilterArg = None, doc_ids: list[str] | None = None, mode: str | None = None,
               min_score: float | None = None, index: str | None = None,
               bm25_alpha: float | None = None) -> AnswerResponse:
        """POST /v1/answer: an answer from the top k chunks with [n] citations (needs a server with an LLM)."""
        request = AnswerRequest(query=query, k=k, max_tokens=max_tokens, filter=_filter(filter), doc_ids=doc_ids,
                                mode=mode, min_score=min_score, index=index, bm25_alpha=bm25_alpha)
        return self._run(_Call("POST", "/v1/answer", request.body(), None, AnswerResponse))

    def chunk(self, chunk_id: str, *, index: str | None = None) -> ChunkResponse:
        """GET /v1/chunks/{chunk_id}: the chunk with its generated questions."""
        return self._run(_Call("GET", f"/v1/chunks/{quote_id(chunk_id)}", None, _index(index), ChunkResponse))

    def document(self, doc_id: str, *, index: str | None = None) -> DocumentResponse:
        """GET /v1/documents/{doc_id}: the document's chunks in order."""
        return self._run(_Call("GET", f"/v1/documents/{quote_id(doc_id)}", None, _index(index), DocumentResponse))

    def indexes(self) -> IndexesResponse:
        """GET /v1/indexes: the index this key may query."""
        return self._run(_Call("GET", "/v1/indexes", None, None, IndexesResponse))

    def upsert(self, documents: Sequence[Document | Mapping[str, Any]], index: str | None = None) -> WriteReceipt:
        """POST /v1/documents (a write key): add documents, or replace those whose id the index holds (all
        of their chunks). The server answers once the batch is durable; `wait_until_searchable` waits
        until a search sees it. A record the client can tell is invalid raises pydantic's ValidationError
        (a ValueError) before anything is sent."""
        request = UpsertRequest(documents=[_document(d) for d in documents], index=index)
        return self._run(_Call("POST", "/v1/documents", request.body(), None, WriteReceipt))

    def delete(self, ids: list[str] | None = None, filter: FilterArg = None,
               index: str | None = None) -> WriteReceipt:
        """DELETE /v1/documents (a write key): remove these documents, or every document the filter (the
        search filter's grammar) passes; exactly one of the two. Ids the index does not hold are no error."""
        request = DeleteRequest(ids=ids, filter=_filter(filter), index=index)
        return self._run(_Call("DELETE", "/v1/documents", request.body(), None, WriteReceipt))

    def write_status(self, write_id: str) -> WriteStatus:
        """GET /v1/writes/{write_id}: where one of this tenant's writes stands."""
        return self._run(_Call("GET", f"/v1/writes/{quote_id(write_id)}", None, None, WriteStatus))


def _filter(filter_arg: FilterArg) -> Filter | None:
    if filter_arg is None:
        return None
    if isinstance(filter_arg, BaseModel):
        return filter_arg.model_dump(mode="json", exclude_none=True)
    return dict(filter_arg)


def _document(record: Document | Mapping[str, Any]) -> Document:
    return record if isinstance(record, Document) else Document.model_validate(dict(record))


def _write_id(write: str | WriteReceipt | WriteStatus) -> str:
    return write if isinstance(write, str) else write.write_id


def _index(index: str | None) -> dict[str, str] | None:
    return None if index is None else {"index": index}


class _Base(_Routes):
    def __init__(self, url: str, api_key: str | None, timeout: float | httpx.Timeout, retry: RetryPolicy | None,
                 headers: Mapping[str, str] | None):
        self.url = url.rstrip("/")
        self.retry = retry if retry is not None else RetryPolicy()
        self._options: dict[str, Any] = {
            "base_url": self.url, "timeout": timeout,
            "headers": {"User-Agent": f"qrag-client/{__version__}", **(headers or {}),
                        **({"Authorization": f"Bearer {api_key}"} if api_key else {})}}

    def _request(self, call: _Call) -> dict[str, Any]:
        return {"method": call.method, "url": call.path, "json": call.body, "params": call.params}

    def _decode(self, call: _Call, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise error_from_response(self.url, response)
        if response.is_redirect:
            raise UnexpectedResponseError(self.url, response.status_code, response.text,
                                          location=response.headers.get("location", ""))
        try:
            return call.model.model_validate(response.json())
        except (ValueError, ValidationError):  # a JSONDecodeError is a ValueError
            raise UnexpectedResponseError(self.url, response.status_code, response.text) from None

    def _transport_error(self, error: httpx.TransportError) -> QragConnectionError:
        if isinstance(error, httpx.TimeoutException):
            message = f"no answer within the timeout ({error})"
            connection_error: QragConnectionError = QragTimeoutError(self.url, message)
        else:
            connection_error = QragConnectionError(self.url, str(error) or type(error).__name__)
        # a connection that was never made sent nothing: safe to retry whatever the route
        connection_error.nothing_sent = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
        return connection_error

    def _wait_or_raise(self, attempt: int, error: QragClientError) -> float:
        wait = self.retry.delay(attempt, error)
        if wait is None:
            raise error
        return wait

    @staticmethod
    def _searchable(status: WriteStatus, deadline: float, timeout: float) -> bool:
        """True once the write is searchable; raises WriteFailedError for a failed one, WriteTimeoutError
        for one still on its way at the deadline; False: poll again."""
        if status.status == "searchable":
            return True
        if status.status == "failed":
            raise WriteFailedError(status)
        if time.monotonic() >= deadline:
            raise WriteTimeoutError(status, timeout)
        return False


class QragClient(_Base):
    """A qrag server's API, synchronously. `retry`: a RetryPolicy (NO_RETRIES for none); `transport`: an
    httpx transport (tests, proxies). Use it as a context manager, or call close()."""

    def __init__(self, url: str = DEFAULT_URL, api_key: str | None = None, *, timeout: float | httpx.Timeout = 60.0,
                 retry: RetryPolicy | None = None, headers: Mapping[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None):
        super().__init__(url, api_key, timeout, retry, headers)
        self._http = httpx.Client(transport=transport, **self._options)

    def _run(self, call: _Call) -> Any:
        for attempt in itertools.count():
            try:
                return self._decode(call, self._send(call))
            except QragClientError as error:
                wait = self._wait_or_raise(attempt, error)
            time.sleep(wait)

    def _send(self, call: _Call) -> httpx.Response:
        try:
            return self._http.request(**self._request(call))
        except httpx.TransportError as error:
            raise self._transport_error(error) from error

    def wait_until_searchable(self, write: str | WriteReceipt, timeout: float = 30.0,
                              poll: float = 0.2) -> WriteStatus:
        """Poll the write's status every `poll` seconds until a search sees it, and return that status.
        Raises WriteFailedError (the server's reason, the record and field) for a write that failed, and
        WriteTimeoutError (a TimeoutError) when it is not searchable within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.write_status(_write_id(write))
            if self._searchable(status, deadline, timeout):
                return status
            time.sleep(max(0.0, min(poll, deadline - time.monotonic())))

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> QragClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncQragClient(_Base):
    """A qrag server's API on asyncio (or trio, through anyio): every route method is awaited. Use it
    as an async context manager, or await aclose()."""

    def __init__(self, url: str = DEFAULT_URL, api_key: str | None = None, *, timeout: float | httpx.Timeout = 60.0,
                 retry: RetryPolicy | None = None, headers: Mapping[str, str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(url, api_key, timeout, retry, headers)
        self._http = httpx.AsyncClient(transport=transport, **self._options)

    async def _run(self, call: _Call) -> Any:
        for attempt in itertools.count():
            try:
                return self._decode(call, await self._send(call))
            except QragClientError as error:
                wait = self._wait_or_raise(attempt, error)
            await anyio.sleep(wait)

    async def _send(self, call: _Call) -> httpx.Response:
        try:
            return await self._http.request(**self._request(call))
        except httpx.TransportError as error:
            raise self._transport_error(error) from error

    async def wait_until_searchable(self, write: str | WriteReceipt, timeout: float = 30.0,
                                    poll: float = 0.2) -> WriteStatus:
        """QragClient.wait_until_searchable, awaited."""
        deadline = time.monotonic() + timeout
        while True:
            status = await self.write_status(_write_id(write))
            if self._searchable(status, deadline, timeout):
                return status
            await anyio.sleep(max(0.0, min(poll, deadline - time.monotonic())))

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncQragClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
