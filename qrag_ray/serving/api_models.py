"""Request and response bodies of the HTTP API (pydantic; FastAPI turns them into /docs). Request models
forbid unknown fields: a misspelt `min_socre` should be an error, not silently ignored."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    field_validator,
    model_validator,
)

from qrag_ray.search.filters import MAX_DOC_IDS, MAX_FILTER_CLAUSES, MAX_FILTER_DEPTH, MAX_IN_VALUES
from qrag_ray.search.page import MetadataValue, SearchResult
from qrag_ray.search.query import MAX_K

MAX_QUERY_CHARS = 2000
INDEX_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # tenant names
NOT_BLANK = r"\S"  # JSON Schema patterns are searches: "contains a non-space character"

# What each error status means on this API (every route documents the ones it can answer).
ERROR_DESCRIPTIONS = {
    400: "the request body is not valid JSON (or is nested too deeply to parse)",
    401: "missing, malformed or unknown API key",
    403: "the key may not read the index named, or the server has no admin key, or (write routes) a read key",
    404: "unknown index, or (GET /v1/chunks, /v1/documents, /v1/writes) unknown id",
    422: "a field is missing, of the wrong type or out of range, or the query is too long (`detail` lists each); "
         "`invalid_filter`: a filter this index cannot evaluate (a field it lacks, an operator or value that does not "
         "fit the field's type, too deep or too long); `invalid_document`: a written record that is not a document "
         "of this index (the message and `detail` name its position and field; nothing of the batch is applied)",
    409: "a request this index cannot serve as built (bm25_alpha on an index without a BM25 channel; "
         "`not_writable`: writes to an index that cannot take them)",
    413: "`too_large`: more documents or bytes than one write request may carry",
    429: "the tenant is over its request rate, or (`write_backlog`) its queued writes over their bound (Retry-After)",
    501: "mode=hyde and /v1/answer need an LLM, and this server has none configured",
    502: "the LLM backend failed",
    503: "index unavailable, a shard down after a retry, or the server at capacity",
    504: "the request missed its deadline",
}


def _int_not_bool_or_text(value):
    if isinstance(value, (bool, str)):
        raise ValueError("Input should be a valid integer")
    return value


# Numbers as JSON Schema types them, so the published schema and the server agree on what is valid (the
# schemathesis test holds them to it): pydantic's lax mode would take `true` for a number and "5" for an
# integer; JSON Schema's integer does include 5.0.
JsonInt = Annotated[int, BeforeValidator(_int_not_bool_or_text)]
JsonNumber = StrictFloat  # a JSON number, ints included; not a bool, not a string


class _Filter(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ComparisonFilter(_Filter):
    type: Literal["eq", "ne", "gt", "gte", "lt", "lte"]
    key: str = Field(..., min_length=1, max_length=128, description="a metadata field of the index")
    value: StrictStr | JsonNumber | StrictBool = Field(
        ..., description="dates and datetimes as ISO-8601 strings; on a list-of-strings field eq matches when any "
                         "element does, ne when none does")


class InFilter(_Filter):
    type: Literal["in", "nin"]
    key: str = Field(..., min_length=1, max_length=128, description="a metadata field of the index")
    value: list[StrictStr | JsonNumber] = Field(..., max_length=MAX_IN_VALUES,
                                                description=f"at most {MAX_IN_VALUES} values")


class CompoundFilter(_Filter):
    type: Literal["and", "or"]
    filters: list["Filter"] = Field(..., min_length=1, max_length=MAX_FILTER_CLAUSES,
                                    description=f"nested at most {MAX_FILTER_DEPTH} and/or deep, at most "
                                                f"{MAX_FILTER_CLAUSES} comparisons in all")


Filter = Annotated[Union[ComparisonFilter, InFilter, CompoundFilter], Field(discriminator="type")]
CompoundFilter.model_rebuild()


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, json_schema_extra={"pattern": NOT_BLANK},
                       description=f"the question, 1..{MAX_QUERY_CHARS} characters, not only whitespace")
    mode: Literal["default", "hyde"] = Field(
        "default", description="default: embed the query; hyde: embed an LLM-written hypothetical answer passage")
    min_score: JsonNumber | None = Field(None, ge=-1.0, le=1.0, description="drop chunks scoring below this cosine")
    index: str | None = Field(None, pattern=INDEX_NAME,
                              description="index name; defaults to the one the API key belongs to")
    bm25_alpha: JsonNumber | None = Field(
        None, ge=0.0, le=1.0, description="hybrid search with this dense weight (the index needs a BM25 channel); "
                                          "default: the index's own setting")
    filter: Filter | None = Field(None, description="only chunks whose document metadata passes it (a pre-filter: "
                                                    "k chunks whenever k pass); docs/SERVING.md, Filters")
    doc_ids: list[StrictStr] | None = Field(None, max_length=MAX_DOC_IDS,
                                            description="only chunks of these documents (ANDed with filter)")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not re.search(NOT_BLANK, value):  # the schema's own pattern, so both agree on every character
            raise ValueError("must not be empty or whitespace")
        return value


class SearchRequest(_Request):
    k: JsonInt = Field(10, ge=1, le=MAX_K, description=f"number of distinct chunks, 1..{MAX_K}")
    include_vectors: bool = Field(False, description="also return the query's vector and each result's best-matching "
                                                     "stored vector (for re-ranking, e.g. maximal marginal relevance)")


class AnswerRequest(_Request):
    k: JsonInt = Field(5, ge=1, le=MAX_K, description="chunks given to the LLM as context")
    max_tokens: JsonInt = Field(256, ge=1, le=2048)


class SearchTimings(BaseModel):
    """Where one request's time went inside the Router, and what it shared with the requests beside it."""

    path: Literal["router", "shards"] = Field(
        ..., description="where the shards were searched: 'shards' (the ShardSearcher replicas), or 'router' "
                         "(a small tenant, inside the Router)")
    embed_ms: float = Field(..., description="the query embedding (waiting for and running its model call)")
    embed_batch: int = Field(..., description="queries embedded in that one model call")
    search_batch: int = Field(..., description="queries of this index version searched together")
    search_ms: float = Field(..., description="the shard fan-out")
    merge_ms: float = Field(..., description="merge + dedup across shards")
    format_ms: float
    rounds: int = Field(..., description="the most widening rounds any shard needed")
    candidates: int = Field(..., description="vector hits the shards found for this query")
    shard_search_ms: list[float] = Field(..., description="each shard's own search")
    cold_loads: int = Field(..., description="shards a replica read from disk for this request")
    shard_replicas: list[str] = Field(..., description="the replica that searched each shard ('' inside the Router)")
    router_replica: str = Field("", description="the Router replica that answered")


class SearchResponse(BaseModel):
    results: list[SearchResult]
    index: str
    index_version: str
    mode: str
    took_ms: float
    hypothetical: str | None = Field(None, description="mode=hyde: the passage that was embedded")
    query_vector: list[float] | None = Field(None, description="with include_vectors: the query's own vector "
                                                               "(L2-normalised), as the shards were searched with")
    timings: SearchTimings


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


class ChunkResponse(BaseModel):
    chunk_id: str
    doc_id: str
    title: str
    text: str
    url: str | None
    metadata: dict[str, MetadataValue]
    questions: list[str] = Field(..., description="the chunk's generated questions stored in the index ([] when none)")
    index: str
    index_version: str


class DocumentChunk(BaseModel):
    chunk_id: str
    title: str
    text: str
    questions: list[str]


class DocumentResponse(BaseModel):
    doc_id: str
    title: str
    url: str | None
    metadata: dict[str, MetadataValue]
    chunks: list[DocumentChunk] = Field(..., description="in document order")
    index: str
    index_version: str


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
    status: Literal["ok"]


class ReadyResponse(BaseModel):
    status: Literal["starting"]


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(..., description="path of the offending field in the body")
    msg: str
    type: str


class ErrorResponse(BaseModel):
    error: str = Field(
        ..., description="stable machine-readable kind, e.g. unauthorized, rate_limited, deadline_exceeded")
    message: str = Field(..., description="one human-readable line")
    detail: list[ValidationIssue] | None = Field(None, description="422: one entry per invalid field")


class TenantStatus(BaseModel):
    name: str
    status: Literal["ok", "error"]
    problems: list[str] = Field(default_factory=list)
    serving_version: str | None = Field(None, description="the version requests start on now")
    current_version: str | None = Field(None, description="the version the index path points at (newer while it loads)")
    num_shards: int | None = None
    searched_in: Literal["router", "shards"] | None = Field(
        None, description="small indexes are searched inside the Router, bigger ones by the ShardSearcher replicas")
    rate_limit: dict | None = None


class ColdLoads(BaseModel):
    shard: int = Field(..., description="a shard number")
    cold_loads: int = Field(..., description="its loads from disk, any tenant's, since the replica started")
    seconds: float = Field(..., description="their total seconds (read, and verify where not yet verified here)")
    max_seconds: float = Field(..., description="the slowest one")


class CacheStatus(BaseModel):
    """A replica's cache of opened shards: the Router's (small tenants) or one ShardSearcher deployment's
    (from the replica Serve routed the status call to; the Prometheus metrics qrag_shard_cache_events and
    qrag_shard_load_seconds cover every replica)."""

    shard: int | None = Field(None, description="the ShardSearcher deployment's number (None: the Router's cache)")
    reachable: bool = Field(True, description="the deployment answered the status call")
    error: str | None = Field(None, description="why it did not")
    loaded: int | None = Field(None, description="tenant shards in the cache")
    bytes: int | None = Field(None, description="their bytes (FAISS, row metadata, BM25, chunk table), within "
                                                "max_bytes")
    max_bytes: int | None = None
    hits: int = Field(0, description="since the replica started: shards served from memory (searches, fetches, "
                                     "warm-ups)")
    cold_loads: int = Field(0, description="shard read from disk (and verified)")
    evictions: int = Field(0, description="shard pushed out by the byte budget")
    load_seconds: float = Field(0.0, description="total seconds of the cold loads")
    shard_loads: list[ColdLoads] = Field(default_factory=list, description="the cold loads by shard number")


class RegistryStatus(BaseModel):
    path: str | None
    tenants: int
    reloads: int
    loaded_at: float
    error: str | None = None


class AdminStatus(BaseModel):
    status: Literal["ok", "degraded"]
    ready: bool = Field(..., description="the first tenants are loaded (GET /readyz answers 200)")
    tenants: list[TenantStatus]
    shards: list[CacheStatus] = Field(..., description="each ShardSearcher deployment's cache")
    router_cache: CacheStatus = Field(..., description="this Router replica's cache of small tenants' shards")
    registry: RegistryStatus
    inflight: int


# ---- the write routes: POST/DELETE /v1/documents, GET /v1/writes/{write_id} -----------------------------
MAX_DOC_ID_CHARS = 512
MAX_WRITE_DOCUMENTS = 1000  # WriteSettings.max_documents's default: the documented bound (the server answers 413)
DOC_ID = r"^[^\r\n]*\S[^\r\n]*$"  # one line (a --delete-ids file holds one id a line), not only whitespace
WriteMetadataValue = StrictStr | JsonNumber | StrictBool | list[StrictStr] | None
MetadataName = Annotated[str, Field(min_length=1, max_length=128)]


class Document(BaseModel):
    """One document in the index's own input schema (as `qrag index --format jsonl` reads a record)."""

    model_config = ConfigDict(extra="forbid")

    id: StrictStr = Field(..., min_length=1, max_length=MAX_DOC_ID_CHARS, pattern=DOC_ID,
                          description=f"the document id, 1..{MAX_DOC_ID_CHARS} characters on one line; a document "
                                      "with an id the index has replaces all of that document's chunks")
    text: StrictStr = Field(..., min_length=1, json_schema_extra={"pattern": NOT_BLANK},
                            description="the document's text, not only whitespace")
    title: StrictStr = ""
    url: StrictStr | None = None
    metadata: dict[MetadataName, WriteMetadataValue] = Field(
        default_factory=dict, description="field: string, number, bool, ISO-8601 date or datetime (as a string), or "
                                          "list of strings; null means absent; one type per field across the index")

    @field_validator("text")
    @classmethod
    def _not_blank(cls, text: str) -> str:
        if not re.search(NOT_BLANK, text):
            raise ValueError("must not be empty or whitespace")
        return text


class DocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[Document] = Field(
        ..., min_length=1, json_schema_extra={"maxItems": MAX_WRITE_DOCUMENTS},
        description="the documents to add or replace (upsert by id), one record per id; at most the server's "
                    f"`writes.max_documents` ({MAX_WRITE_DOCUMENTS} by default) per request: 413 `too_large` beyond")
    index: str | None = Field(None, pattern=INDEX_NAME,
                              description="index name; defaults to the one the API key belongs to")


def _ids_or_filter(schema: dict) -> None:
    """The JSON Schema says what the model enforces: exactly one of `ids` and `filter`, neither null."""
    props = schema["properties"]
    for name in ("ids", "filter"):
        branches = [b for b in props[name].pop("anyOf", []) if b.get("type") != "null"]
        props[name].pop("default", None)
        props[name].update(branches[0])
    schema["oneOf"] = [{"required": ["ids"]}, {"required": ["filter"]}]


class DeleteDocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_ids_or_filter)

    ids: list[Annotated[StrictStr, Field(min_length=1, max_length=MAX_DOC_ID_CHARS, pattern=DOC_ID)]] | None = Field(
        None, min_length=1, description="the documents to delete, by id (ids the index lacks are ignored); at most "
                                         f"the server's `writes.max_documents` ({MAX_WRITE_DOCUMENTS} by default)")
    filter: Filter | None = Field(None, description="instead of ids: every document whose metadata passes this "
                                                    "filter (the search grammar) when the deletion is applied")
    index: str | None = Field(None, pattern=INDEX_NAME,
                              description="index name; defaults to the one the API key belongs to")

    @model_validator(mode="after")
    def _one_of(self) -> "DeleteDocumentsRequest":
        given = [name for name in ("ids", "filter") if name in self.model_fields_set]
        if len(given) != 1 or getattr(self, given[0]) is None:
            raise ValueError("give exactly one of 'ids' (a list of ids) or 'filter' (a filter)")
        return self


class WriteReceipt(BaseModel):
    write_id: str = Field(..., description="the id GET /v1/writes/{write_id} answers for")
    index: str
    operation: Literal["upsert", "delete"]
    status: Literal["queued"]
    documents: int | None = Field(..., description="documents in the batch (null for a delete by filter: known "
                                                   "once it is applied)")


class WriteError(BaseModel):
    record: int | None = Field(None, description="the position of the offending record in the batch")
    field: str | None = Field(None, description="the offending field of that record")
    message: str


class WriteStatus(BaseModel):
    write_id: str
    index: str
    operation: Literal["upsert", "delete"]
    status: Literal["queued", "indexing", "searchable", "failed"]
    documents: int | None = Field(None, description="documents the batch named (a delete by filter: those it "
                                                    "matched, once applied)")
    chunks: int | None = Field(None, description="chunks the batch added (known once it is being indexed)")
    indexed: int = Field(0, description="chunks embedded so far (indexing)")
    submitted_at: float = Field(..., description="unix seconds")
    searchable_at: float | None = Field(None, description="unix seconds: when the write became searchable")
    error: WriteError | None = None
