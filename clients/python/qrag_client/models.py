"""The API's request and response bodies, mirroring the server's (qrag_ray/serving/api_models.py and the
OpenAPI document; tests/clients/test_client_models.py fails when the two drift apart).

Responses keep fields a newer server adds (`extra="allow"`), so an older client keeps working; requests
forbid unknown fields, as the server does, so a misspelt parameter fails here rather than there."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

# the vector kinds whose text is a question the index generated for the chunk (the rest are its own words)
QUESTION_KINDS = ("question", "quote", "atomquote")
MAX_K = 1000  # the most chunks one search returns (the server's bound)

# the search filter's bounds (the server's: docs/SERVING.md, "Metadata and filters")
MAX_FILTER_DEPTH = 8
MAX_FILTER_CLAUSES = 100
MAX_IN_VALUES = 1000

Filter = dict[str, Any]  # the search filter grammar (docs/SERVING.md): {"type": "eq", "key": ..., "value": ...}


def parse_filter(text: str | None) -> Filter | None:
    """A filter given as JSON text on a command line (None stays None); a ValueError says what is wrong.
    The grammar and the fields are the server's to check: it answers 422 invalid_filter, naming them."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ValueError(f"--filter is not valid JSON: {error}") from None
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


class ComparisonFilter(_Request):
    """One metadata field compared with one value."""

    type: Literal["eq", "ne", "gt", "gte", "lt", "lte"]
    key: str = Field(..., min_length=1, max_length=128, description="a metadata field of the index")
    value: StrictStr | StrictInt | StrictFloat | StrictBool = Field(
        ..., description="dates and datetimes as ISO-8601 strings; on a list-of-strings field eq matches when any "
                         "element does, ne when none does")


class InFilter(_Request):
    """One metadata field against a set of values."""

    type: Literal["in", "nin"]
    key: str = Field(..., min_length=1, max_length=128, description="a metadata field of the index")
    value: list[StrictStr | StrictInt | StrictFloat] = Field(..., max_length=MAX_IN_VALUES,
                                                             description=f"at most {MAX_IN_VALUES} values")


class CompoundFilter(_Request):
    """Filters joined by and / or."""

    type: Literal["and", "or"]
    filters: list[SearchFilter] = Field(..., min_length=1, max_length=MAX_FILTER_CLAUSES,
                                        description=f"nested at most {MAX_FILTER_DEPTH} and/or deep, at most "
                                                    f"{MAX_FILTER_CLAUSES} comparisons in all")


# The search filter as typed models (the server's grammar, held to its OpenAPI document by the tests): what a
# JSON Schema shows a caller that cannot read docs/SERVING.md (an agent calling the MCP tool `search`).
SearchFilter = Annotated[ComparisonFilter | InFilter | CompoundFilter, Field(discriminator="type")]
CompoundFilter.model_rebuild()


class _QueryRequest(_Request):
    query: str
    mode: str | None = None
    min_score: float | None = None
    index: str | None = None
    bm25_alpha: float | None = None
    filter: Filter | None = None
    doc_ids: list[str] | None = None


class SearchRequest(_QueryRequest):
    k: int | None = None
    include_vectors: bool | None = None


class AnswerRequest(_QueryRequest):
    k: int | None = None
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
    vector: list[float] | None = Field(None, description="with include_vectors: the L2-normalised vector of the "
                                                         "chunk's best-matching row")

    @property
    def matched_question(self) -> str | None:
        """The best-matching question the index generated for this chunk, if one matched."""
        return next((m.text for m in self.matched if m.kind in QUESTION_KINDS), None)

    def chunk_metadata(self, index: str, index_version: str) -> dict[str, Any]:
        """What belongs to the chunk whatever the query: its own metadata fields, then ours (on a name clash
        ours win; the chunk's fields stay whole under `metadata`)."""
        return {**self.metadata, "chunk_id": self.chunk_id, "doc_id": self.doc_id, "title": self.title,
                "url": self.url, "index": index, "index_version": index_version, "metadata": dict(self.metadata)}

    def match_details(self) -> dict[str, Any]:
        """What this query's match adds: the scores and the best-matching text (a generated question, or
        the chunk's own words)."""
        best = self.matched[0] if self.matched else None
        return {"score": self.score, "cosine": self.cosine, "bm25": self.bm25,
                "matched_question": self.matched_question, "matched_kind": best.kind if best else None,
                "matched_text": best.text if best else None}

    def flat_metadata(self, index: str, index_version: str) -> dict[str, Any]:
        """What the LangChain retriever attaches to a document: chunk_metadata, then match_details."""
        return {**self.chunk_metadata(index, index_version), **self.match_details()}


class SearchResponse(_Response):
    results: list[SearchResult]
    index: str
    index_version: str
    mode: str
    took_ms: float
    hypothetical: str | None = None
    timings: dict[str, Any] = Field(default_factory=dict)
    query_vector: list[float] | None = Field(None, description="with include_vectors: the query's vector")


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


# ---- writes (docs/SERVING.md: the write route) ------------------------------------------------------------------
class Document(_Request):
    """One document to write: the index's own input record, as `qrag index --format jsonl` reads it. An
    existing id is replaced whole (all of its chunks); metadata values as the index's schema types them."""

    id: str = Field(..., min_length=1, max_length=512)
    text: str = Field(..., min_length=1)
    title: str = ""
    url: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class UpsertRequest(_Request):
    documents: list[Document] = Field(..., min_length=1)
    index: str | None = None


class DeleteRequest(_Request):
    """Exactly one of `ids` and `filter` (the search filter's grammar)."""

    ids: list[str] | None = None
    filter: Filter | None = None
    index: str | None = None

    @model_validator(mode="after")
    def _one_selector(self) -> DeleteRequest:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give exactly one of ids and filter")
        return self


class WriteReceipt(_Response):
    """A write the server took (202): durable in its log, searchable later (see WriteStatus)."""

    write_id: str
    index: str
    operation: str  # upsert | delete
    status: str  # queued
    documents: int | None = None  # None for a delete by filter: known once it is applied


class WriteError(_Response):
    """Why a write failed: the record's position in the batch and its field, when one is to blame."""

    record: int | None = None
    field: str | None = None
    message: str


class WriteStatus(_Response):
    """GET /v1/writes/{write_id}: where a write stands."""

    write_id: str
    index: str
    operation: str  # upsert | delete
    status: str  # queued | indexing | searchable | failed
    documents: int | None = None
    chunks: int | None = None
    indexed: int = 0  # chunks embedded so far
    submitted_at: float
    searchable_at: float | None = None
    error: WriteError | None = None
