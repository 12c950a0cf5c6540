"""Request and response bodies of the HTTP API (pydantic), which FastAPI also turns into /docs.

Limits are constants here so that the API, its OpenAPI schema and the tests agree on them. Request
models forbid unknown fields: a misspelt `min_socre` should be an error, not silently ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_QUERY_CHARS = 2000
MAX_K = 100
DEFAULT_K = 10
DEFAULT_ANSWER_K = 5
MODES = ("default", "hyde")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., max_length=MAX_QUERY_CHARS, description=f"the question, 1..{MAX_QUERY_CHARS} characters")
    mode: Literal["default", "hyde"] = Field(
        "default", description="default: embed the query; hyde: embed an LLM-written hypothetical answer passage")
    min_score: float | None = Field(None, ge=-1.0, le=1.0, description="drop chunks scoring below this cosine")
    index: str | None = Field(None, description="index name; defaults to the one the API key belongs to")
    bm25_alpha: float | None = Field(
        None, ge=0.0, le=1.0, description="hybrid search with this dense weight (the index needs a BM25 channel); "
                                          "default: the index's own setting")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty or whitespace")
        return v


class SearchRequest(_Request):
    k: int = Field(DEFAULT_K, ge=1, le=MAX_K, description=f"number of distinct chunks, 1..{MAX_K}")


class AnswerRequest(_Request):
    k: int = Field(DEFAULT_ANSWER_K, ge=1, le=MAX_K, description="chunks given to the LLM as context")
    max_tokens: int = Field(256, ge=1, le=2048)


class Match(BaseModel):
    kind: str = Field(..., description="vector kind that matched: question, chunk, sentence, quote, ...")
    text: str
    score: float


class SearchResult(BaseModel):
    chunk_id: str
    doc_id: str
    title: str = ""
    score: float = Field(..., description="the chunk's score under the index's fusion policy (plain: its best vector's cosine)")
    text: str
    matched: list[Match] = Field(default_factory=list, description="the chunk's best-matching vectors, best first")
    bm25: float | None = Field(None, description="hybrid indexes: the chunk's BM25 score over the query's best (0..1)")


class SearchResponse(BaseModel):
    results: list[SearchResult]
    index: str
    index_version: str
    mode: str
    took_ms: float
    hypothetical: str | None = Field(None, description="mode=hyde: the passage that was embedded")
    timings: dict = Field(default_factory=dict,
                          description="embed_ms, search_ms (shard fan-out), merge_ms (merge + dedup), format_ms, rounds")


class Citation(BaseModel):
    n: int = Field(..., description="the [n] used in the answer")
    chunk_id: str
    doc_id: str


class AnswerResponse(BaseModel):
    answer: str
    citations: list[Citation]
    results: list[SearchResult]
    index: str
    index_version: str
    mode: str
    took_ms: float


class IndexInfo(BaseModel):
    name: str
    index_version: str | None
    representation: str | None
    num_shards: int | None
    embedder: str | None
    counts: dict = Field(default_factory=dict)
    available: bool
    error: str | None = None


class IndexesResponse(BaseModel):
    indexes: list[IndexInfo]


class HealthResponse(BaseModel):
    status: Literal["ok", "unhealthy"]
    problems: list[dict] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    error: str
    message: str
