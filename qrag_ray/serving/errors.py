"""HTTP-facing errors: one exception type carrying status, a stable machine-readable kind and a message.

Every user-caused failure in the serving path becomes an `ApiError`, which the router renders as
`{"error": kind, "message": ...}` with its status (never a 500), and which the errors metric counts by
`kind`. Anything else is a bug and stays a 500 with a traceback in the replica log.
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}


def unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, {"WWW-Authenticate": "Bearer"})


def not_found(message: str) -> ApiError:
    return ApiError(404, "not_found", message)


def llm_not_configured(what: str) -> ApiError:
    """501: a feature this server does not offer, not a temporary outage (clients retry a 503)."""
    return ApiError(501, "llm_not_configured",
                    f"{what} needs an LLM, and this server has none configured: start it with a generator "
                    "(qrag serve --llm-url URL, or args.generator in the serve config)")


def index_unavailable(index: str, reason: str) -> ApiError:
    return ApiError(503, "index_unavailable", f"index '{index}' is unavailable: {reason}")


def bad_request(kind: str, message: str, status: int = 400) -> ApiError:
    return ApiError(status, kind, message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def llm_failed(message: str) -> ApiError:
    return ApiError(502, "llm_failed", f"the LLM backend failed: {message}")


def rate_limited(tenant: str, retry_after: int) -> ApiError:
    return ApiError(429, "rate_limited", f"tenant '{tenant}' is over its request rate; retry in {retry_after} s",
                    {"Retry-After": str(retry_after)})


def overloaded(why: str) -> ApiError:
    return ApiError(503, "overloaded", f"the server is at capacity ({why}); retry shortly", {"Retry-After": "1"})


def shard_unavailable(shard: int, why: str) -> ApiError:
    return ApiError(503, "shard_unavailable", f"shard {shard} did not answer ({why}), also on a retry; "
                                              "retry shortly", {"Retry-After": "1"})


def deadline_exceeded(seconds: float, stage: str) -> ApiError:
    return ApiError(504, "deadline_exceeded", f"the request did not finish within its {seconds:g} s deadline "
                                              f"(it was {stage})")
