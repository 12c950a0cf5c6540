"""The API's request and response bodies, mirroring the server's (qrag_ray/serving/api_models.py and the
OpenAPI document; tests/clients/test_client_models.py fails when the two drift apart).

Responses keep fields a newer server adds (`extra="allow"`), so an older client keeps working; requests
forbid unknown fields, as the server does, so a misspelt parameter fails here rather than there."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# the vector kinds whose text is a question the index generated for the chunk (the rest are its own words)
QUESTION_KINDS = ("question", "quote", "atomquote")

Filter = dict[str, Any]  # the search filter grammar (docs/SERVING.md): {"type": "eq", "key": ..., "value": ...}


def parse_filter(text: str | None) -> Filter | None:
    """A filter given as JSON text on a command line (None stays None); a ValueError says what is wrong.
    The grammar and the fields are the server's to check: it answers 422 invalid_filter, naming them."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--filter is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError('--filter must be a JSON object, e.g. {"type": "eq", "key": "lang", "value": "en"}')
    return value


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def body(self) -> dict[str, Any]:
        """The JSON body: only the fields given, so the server's defaults apply to the rest."""
        return self.model_dump(mode="json", exclude_none=True)


class SearchRequest(_Request):
    query: str
    k: int | None = None
    mode: str | None = None
    min_score: float | None = None
    index: str | None = None
    bm25_alpha: float | None = None
    filter: Filter | None = None
    doc_ids: list[str] | None = None


class AnswerRequest(SearchRequest):
    max_tokens: int | None = None


class Match(_Response):
    kind: str
    text: str
    score: float


class SearchResult(_Response):
    chunk_id: str
    doc_id: str
    title: str = ""
    score: float
    text: str
    matched: list[Match] = Field(default_factory=list)
    bm25: float | None = None
    cosine: float | None = None
    url: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def matched_question(self) -> str | None:
        """The best-matching question the index generated for this chunk, if one matched."""
        return next((m.text for m in self.matched if m.kind in QUESTION_KINDS), None)

    def flat_metadata(self, index: str, index_version: str) -> dict[str, Any]:
        """What the framework adapters attach to a document: the chunk's own metadata fields, then ours
        (on a name clash ours win; the chunk's fields stay whole under `metadata`)."""
        best = self.matched[0] if self.matched else None
        return {**self.metadata, "chunk_id": self.chunk_id, "doc_id": self.doc_id, "title": self.title,
                "url": self.url, "score": self.score, "cosine": self.cosine, "bm25": self.bm25,
                "matched_question": self.matched_question, "matched_kind": best.kind if best else None,
                "matched_text": best.text if best else None, "index": index, "index_version": index_version,
                "metadata": dict(self.metadata)}


class SearchResponse(_Response):
    results: list[SearchResult]
    index: str
    index_version: str
    mode: str
    took_ms: float
    hypothetical: str | None = None
    timings: dict[str, Any] = Field(default_factory=dict)


class Citation(_Response):
    n: int
    chunk_id: str
    doc_id: str


class AnswerResponse(_Response):
    answer: str
    citations: list[Citation]
    results: list[SearchResult]
    index: str
    index_version: str
    mode: str
    took_ms: float


class IndexInfo(_Response):
    name: str
    index_version: str | None
    representation: str | None
    num_shards: int | None
    embedder: str | None
    counts: dict[str, Any] = Field(default_factory=dict)
    available: bool
    error: str | None = None


class IndexesResponse(_Response):
    indexes: list[IndexInfo]


class ChunkResponse(_Response):
    """GET /v1/chunks/{chunk_id}: one chunk with the questions generated for it."""

    chunk_id: str
    doc_id: str
    title: str = ""
    text: str
    url: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    questions: list[str] = Field(default_factory=list)
    index: str
    index_version: str


class DocumentChunk(_Response):
    chunk_id: str
    title: str = ""
    text: str
    questions: list[str] = Field(default_factory=list)


class DocumentResponse(_Response):
    """GET /v1/documents/{doc_id}: a document's chunks in document order."""

    doc_id: str
    title: str = ""
    url: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    chunks: list[DocumentChunk]
    index: str
    index_version: str

    @property
    def text(self) -> str:
        """The document's text as its chunks hold it, in order (overlapping chunks repeat their overlap)."""
        return "\n\n".join(c.text for c in self.chunks)


class ValidationIssue(_Response):
    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(_Response):
    error: str
    message: str
    detail: list[ValidationIssue] | None = None
