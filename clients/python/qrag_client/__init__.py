"""qrag-client: a light client for a qrag-ray server (httpx + pydantic), with framework adapters as
extras: qrag_client.langchain, qrag_client.llamaindex, qrag_client.mcp_server."""

__version__ = "0.1.0"  # released with the qrag-ray of the same version, whose API it mirrors

from qrag_client.client import DEFAULT_URL, NO_RETRIES, AsyncQragClient, QragClient, RetryPolicy  # noqa: E402
from qrag_client.errors import (AuthenticationError, BadRequestError, ConflictError,  # noqa: E402
                                DeadlineExceededError, InvalidRequestError, NotConfiguredError, NotFoundError,
                                PermissionDeniedError, QragAPIError, QragClientError, QragConnectionError,
                                QragTimeoutError, RateLimitError, ServiceUnavailableError, UnexpectedResponseError,
                                UpstreamError)
from qrag_client.models import (AnswerResponse, ChunkResponse, Citation, DocumentChunk,  # noqa: E402
                                DocumentResponse, IndexesResponse, IndexInfo, Match, SearchResponse, SearchResult)

__all__ = [
    "DEFAULT_URL", "NO_RETRIES", "AsyncQragClient", "QragClient", "RetryPolicy",
    "AuthenticationError", "BadRequestError", "ConflictError", "DeadlineExceededError", "InvalidRequestError",
    "NotConfiguredError", "NotFoundError", "PermissionDeniedError", "QragAPIError", "QragClientError",
    "QragConnectionError", "QragTimeoutError", "RateLimitError", "ServiceUnavailableError",
    "UnexpectedResponseError", "UpstreamError",
    "AnswerResponse", "ChunkResponse", "Citation", "DocumentChunk", "DocumentResponse", "IndexesResponse",
    "IndexInfo", "Match", "SearchResponse", "SearchResult",
]
