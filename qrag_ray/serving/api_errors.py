"""HTTP-facing errors: every user-caused failure in the serving path is an `ApiError`, rendered as
`{"error": kind, "message": ...}` with its status (never a 500) and counted by `kind` in the errors
metric. Anything else is a bug and stays a 500 with a traceback in the replica log."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None,
                 detail: list[dict] | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}
        self.detail = detail  # the body's `detail` ({loc, msg, type} per issue), as a validation error has


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


# ---- the write routes (POST/DELETE /v1/documents, GET /v1/writes/{id}) --------------------------------
def not_writable(index: str, why: str) -> ApiError:
    return ApiError(409, "not_writable", f"index '{index}' cannot take writes: {why}")


def too_large(message: str) -> ApiError:
    return ApiError(413, "too_large", message)


def invalid_document(record: int | None, field: str | None, message: str) -> ApiError:
    """A bad record of a write: the message names its position and field, `detail` says them as data."""
    loc: list = ["documents"] + ([record] if record is not None else []) + (field.split(".") if field else [])
    where = "" if record is None else f"record {record}" + (f", field '{field}'" if field else "") + ": "
    return ApiError(422, "invalid_document", where + message,
                    detail=[{"loc": loc, "msg": message, "type": "invalid_document"}])


def write_backlog(index: str, queued: int, limit: int, retry_after: int) -> ApiError:
    return ApiError(429, "write_backlog", f"index '{index}' has {queued} bytes of writes queued, over its bound of "
                    f"{limit}; retry in {retry_after} s", {"Retry-After": str(retry_after)})
