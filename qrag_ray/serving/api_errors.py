"""HTTP-facing errors: every user-caused failure in the serving path is an `ApiError`, rendered as
`{"error": kind, "message": ...}` with its status (never a 500) and counted by `kind` in the errors
metric. Anything else is a bug and stays a 500 with a traceback in the replica log."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}


def unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, {"WWW-Authenticate": "Bearer"})


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def index_unavailable(index: str, reason: str) -> ApiError:
    return ApiError(503, "index_unavailable", f"index '{index}' is unavailable: {reason}")


def overloaded(why: str) -> ApiError:
    return ApiError(503, "overloaded", f"the server is at capacity ({why}); retry shortly", {"Retry-After": "1"})


def shard_unavailable(deployment: str, why: str) -> ApiError:
    """A shard deployment that did not answer, also on a retry (503, retry shortly)."""
    return ApiError(503, "shard_unavailable", f"{deployment} did not answer ({why}), also on a retry; retry shortly",
                    {"Retry-After": "1"})
