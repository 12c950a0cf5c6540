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
        self.url, self.reason = url, reason


class QragTimeoutError(QragConnectionError):
    """No answer within the client's timeout."""


class UnexpectedResponseError(QragClientError):
    """An answer that is not the API's: a non-JSON body, or JSON that is neither a result nor an error."""

    def __init__(self, url: str, status: int, body: str):
        super().__init__(f"{url} answered HTTP {status} with a non-JSON body" if not _is_json(body)
                         else f"{url} answered HTTP {status} with an unexpected body: {body[:200]}")
        self.url, self.status, self.body = url, status, body


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
        self.status, self.kind, self.message, self.detail = status, kind, message, detail
        self.headers = dict(headers or {})
        self.retry_after = parse_retry_after(self.headers.get("retry-after"))


class BadRequestError(QragAPIError):
    status = 400  # malformed_json


class AuthenticationError(QragAPIError):
    status = 401  # unauthorized: missing, malformed or unknown key


class PermissionDeniedError(QragAPIError):
    status = 403  # forbidden: another tenant's index


class NotFoundError(QragAPIError):
    status = 404  # not_found: unknown index, chunk or document


class ConflictError(QragAPIError):
    status = 409  # e.g. no_bm25_index: a valid request this index cannot serve


class InvalidRequestError(QragAPIError):
    status = 422  # invalid_request, query_too_long, invalid_filter (`detail` lists the fields)


class RateLimitError(QragAPIError):
    status = 429  # rate_limited (Retry-After)


class NotConfiguredError(QragAPIError):
    status = 501  # llm_not_configured: mode=hyde or /v1/answer on a server without an LLM


class UpstreamError(QragAPIError):
    status = 502  # llm_failed


class ServiceUnavailableError(QragAPIError):
    status = 503  # index_unavailable, shard_unavailable, overloaded (may carry Retry-After)


class DeadlineExceededError(QragAPIError):
    status = 504  # deadline_exceeded


ERRORS_BY_STATUS: dict[int, type[QragAPIError]] = {c.status: c for c in (
    BadRequestError, AuthenticationError, PermissionDeniedError, NotFoundError, ConflictError, InvalidRequestError,
    RateLimitError, NotConfiguredError, UpstreamError, ServiceUnavailableError, DeadlineExceededError)}


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
    """The exception for an error response (status >= 400)."""
    try:
        body = response.json()
    except ValueError:
        return UnexpectedResponseError(url, response.status_code, response.text)
    if not (isinstance(body, dict) and isinstance(body.get("error"), str)):
        return UnexpectedResponseError(url, response.status_code, response.text)
    cls = ERRORS_BY_STATUS.get(response.status_code, QragAPIError)
    return cls(response.status_code, body["error"], str(body.get("message", "")), body.get("detail"),
               dict(response.headers))
