"""qrag-client: a light client for a qrag-ray server (httpx + pydantic), with framework adapters as
extras: qrag_client.langchain, qrag_client.llamaindex, qrag_client.mcp_server."""

__version__ = "0.2.0"  # released with the qrag-ray of the same version, whose API it mirrors

from qrag_client.client import DEFAULT_URL, NO_RETRIES, AsyncQragClient, QragClient, RetryPolicy
from qrag_client.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DeadlineExceededError,
    InvalidRequestError,
    NotConfiguredError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    QragAPIError,
    QragClientError,
    QragConnectionError,
    QragTimeoutError,
    RateLimitError,
    ServiceUnavailableError,
    UnexpectedResponseError,
    UpstreamError,
    WriteFailedError,
    WriteTimeoutError,
)
from qrag_client.models import (
    AnswerResponse,
    ChunkResponse,
    Citation,
    ComparisonFilter,
    CompoundFilter,
    Document,
    DocumentChunk,
    DocumentResponse,
    IndexesResponse,
    IndexInfo,
    InFilter,
    Match,
    SearchFilter,
    SearchResponse,
    SearchResult,
    WriteError,
    WriteReceipt,
    WriteStatus,
)

__all__ = [
    "DEFAULT_URL", "NO_RETRIES", "AsyncQragClient", "QragClient", "RetryPolicy",
    "AuthenticationError", "BadRequestError", "ConflictError", "DeadlineExceededError", "InvalidRequestError",
    "NotConfiguredError", "NotFoundError", "PayloadTooLargeError", "PermissionDeniedError", "QragAPIError",
    "QragClientError", "QragConnectionError", "QragTimeoutError", "RateLimitError", "ServiceUnavailableError",
    "UnexpectedResponseError", "UpstreamError", "WriteFailedError", "WriteTimeoutError",
    "AnswerResponse", "ChunkResponse", "Citation", "ComparisonFilter", "CompoundFilter", "Document", "DocumentChunk",
    "DocumentResponse", "IndexesResponse", "IndexInfo", "InFilter", "Match", "SearchFilter", "SearchResponse",
    "SearchResult", "WriteError", "WriteReceipt", "WriteStatus",
]
