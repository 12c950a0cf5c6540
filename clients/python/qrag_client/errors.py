"""What the client raises: the API's error bodies (`{"error": kind, "message": line, "detail": [...]}`) as
one class per status, and the transport's failures. Every class derives from QragClientError."""

from __future__ import annotations

from typing import Any

import httpx


class QragClientError(Exception):
    """Anything this client raises."""


class QragConnectionError(QragClientError):
    """The server could not be reached (refused, reset, DNS), or did not answer in time. `nothing_sent`:
    the connection was never made, so a retry cannot repeat a request."""

    nothing_sent: bool = False

    def __init__(self, url: str, reason: str):
        super().__init__(f"cannot reach {url}: {reason}")
        self.url = url
        self.reason = reason


class QragTimeoutError(QragConnectionError):
    """No answer within the client's timeout."""


class UnexpectedResponseError(QragClientError):
    """An answer that is not the API's: a non-JSON body, JSON that is neither a result nor an error, or a
    redirect (`location`: the API never redirects, a server without the route may)."""

    def __init__(self, url: str, status: int, body: str, location: str | None = None):
        if location is not None:
            message = f"{url} answered HTTP {status}, a redirect to {location}: does this server have the route?"
        elif not _is_json(body):
            message = f"{url} answered HTTP {status} with a non-JSON body"
        else:
            message = f"{url} answered HTTP {status} with an unexpected body: {body[:200]}"
        super().__init__(message)
        self.url = url
        self.status = status
        self.body = body
        self.location = location


def _is_json(text: str) -> bool:
    import json

    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class QragAPIError(QragClientError):
    """An error the API answered with: `status`, its stable `kind` (`error`), the one-line `message`,
    and on 422 `detail` (one entry per invalid field); `retry_after` (seconds) when the server sent it."""

    status: int = 0

    def __init__(self, status: int, kind: str, message: str, detail: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(f"HTTP {status} {kind}: {message}")
        self.status = status
        self.kind = kind
        self.message = message
        self.detail = detail
        self.headers = dict(headers or {})
        self.retry_after = parse_retry_after(self.headers.get("retry-after"))


class BadRequestError(QragAPIError):
    status = 400  # malformed_json


class AuthenticationError(QragAPIError):
    status = 401  # unauthorized: missing, malformed or unknown key


class PermissionDeniedError(QragAPIError):
    status = 403  # forbidden: another tenant's index, or a read key on a write route


class NotFoundError(QragAPIError):
    status = 404  # not_found: unknown index, chunk or document


class ConflictError(QragAPIError):
    status = 409  # no_bm25_index, not_writable: a valid request this index cannot serve (the message says why)


class PayloadTooLargeError(QragAPIError):
    status = 413  # too_large: more records or bytes than one request may carry (the message names the bound)


class InvalidRequestError(QragAPIError):
    status = 422  # invalid_request, query_too_long, invalid_filter, invalid_document (`detail` lists the fields)


class RateLimitError(QragAPIError):
    status = 429  # rate_limited, write_backlog (Retry-After)


class NotConfiguredError(QragAPIError):
    status = 501  # llm_not_configured: mode=hyde or /v1/answer on a server without an LLM


class UpstreamError(QragAPIError):
    status = 502  # llm_failed


class ServiceUnavailableError(QragAPIError):
    status = 503  # index_unavailable, shard_unavailable, overloaded (may carry Retry-After)


class DeadlineExceededError(QragAPIError):
    status = 504  # deadline_exceeded


ERRORS_BY_STATUS: dict[int, type[QragAPIError]] = {c.status: c for c in (
    BadRequestError, AuthenticationError, PermissionDeniedError, NotFoundError, ConflictError, PayloadTooLargeError,
    InvalidRequestError, RateLimitError, NotConfiguredError, UpstreamError, ServiceUnavailableError,
    DeadlineExceededError)}


class WriteFailedError(QragClientError):
    """A write the server took (202) and then could not apply: `status` is its WriteStatus, whose `error`
    names the record's position in the batch and its field when one is to blame. Nothing of that batch
    was applied."""

    def __init__(self, status: Any):
        error = status.error
        where = ""
        if error is not None and error.record is not None:
            where = f"record {error.record}" + (f", field {error.field!r}" if error.field else "") + ": "
        message = error.message if error is not None else "no reason given"
        super().__init__(f"write {status.write_id} to {status.index!r} failed: {where}{message}")
        self.status = status


class WriteTimeoutError(QragClientError, TimeoutError):
    """A write not yet searchable when the wait ended; `status` is its last WriteStatus (the write goes on:
    wait again, or read it with write_status)."""

    def __init__(self, status: Any, timeout: float):
        super().__init__(f"write {status.write_id} to {status.index!r} is still {status.status} after "
                         f"{timeout:g} s ({status.indexed} of {status.chunks if status.chunks is not None else '?'} "
                         "chunks indexed)")
        self.status = status
        self.timeout = timeout


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds; the API sends whole seconds (an HTTP date is not one it sends: None)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_response(url: str, response: httpx.Response) -> QragClientError:
    """The exception for an error response (status >= 400). The API's body is `{"error": kind, "message":
    line}`; the nested spelling `{"error": {"kind": ..., "message": ...}}` reads the same."""
    try:
        body = response.json()
    except ValueError:
        return UnexpectedResponseError(url, response.status_code, response.text)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = {**body["error"], **{k: v for k, v in body.items() if k != "error"}}
        body["error"] = body.pop("kind", None)
    if not (isinstance(body, dict) and isinstance(body.get("error"), str)):
        return UnexpectedResponseError(url, response.status_code, response.text)
    cls = ERRORS_BY_STATUS.get(response.status_code, QragAPIError)
    return cls(response.status_code, body["error"], str(body.get("message", "")), body.get("detail"),
               dict(response.headers))
