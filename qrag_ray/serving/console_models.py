"""Response bodies of the browser console's reads (serving/console.py): what the console shows that the API's
other routes do not return (pydantic; FastAPI turns them into /docs)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from qrag_ray.serving.api_models import CacheStatus, RegistryStatus, TenantStatus


class ConsoleField(BaseModel):
    name: str = Field(..., description="a metadata field of the index")
    type: str = Field(..., description="its type in the manifest: string, number, bool, date, datetime, string_list")
    operators: list[str] = Field(..., description="the filter operators a field of this type takes")


class ConsoleSample(BaseModel):
    chunk_id: str
    doc_id: str
    title: str
    text: str
    questions: list[str] = Field(..., description="the chunk's generated questions ([] when none)")


class ConsoleIndex(BaseModel):
    """The tenant's index as `qrag info` describes it (without its path on the server)."""

    name: str
    index_version: str
    format_version: int | None = None
    created_at: str | None = None
    build_seconds: float | None = None
    representation: str | None = None
    preset: str | None = None
    kinds: list[str] = Field(default_factory=list)
    question_granularity: str | None = None
    embedder: dict = Field(default_factory=dict, description="{model, dim}")
    faiss: dict | None = None
    num_shards: int
    shards: list[dict] = Field(default_factory=list, description="{id, chunks, vectors, kinds} of each shard")
    counts: dict = Field(default_factory=dict)
    vectors_per_kind: dict[str, int] = Field(default_factory=dict)
    bm25: dict | None = Field(None, description="{docs, vocabulary, alpha} when the index has a BM25 channel")
    bytes: dict[str, int] = Field(default_factory=dict, description="bytes on disk: total and per part")
    metadata_schema: dict[str, str] | None = None
    samples: list[ConsoleSample] = Field(default_factory=list, description="chunks spread over the index")
    fields: list[ConsoleField] = Field(..., description="the metadata fields, by name, with their operators")
    llm: bool = Field(..., description="this server has an LLM: mode=hyde and /v1/answer work")
    bm25_alpha: float | None = Field(None, description="the index's hybrid weight (None: no BM25 channel)")


class ConsoleVector(BaseModel):
    kind: str = Field(..., description="chunk, sentence, window, question, quote, ...")
    text: str = Field(..., description="the text that was embedded")


class ConsoleVectors(BaseModel):
    chunk_id: str
    index: str
    index_version: str
    vectors: list[ConsoleVector] = Field(..., description="every vector of the chunk, in stored order")


class ConsoleRequests(BaseModel):
    """A tenant's API requests in this Router replica's last minute."""

    requests: int
    per_s: float
    p50_ms: float
    p99_ms: float
    errors: int = Field(..., description="answered with a status >= 400")
    server_errors: int = Field(..., description="answered with a status >= 500")


class ConsoleTenant(TenantStatus):
    index_bytes: int | None = Field(None, description="the served version's bytes on disk")
    requests: ConsoleRequests | None = None


class ConsoleCache(CacheStatus):
    where: str = Field(..., description="Router, or the ShardSearcher deployment of a shard number")
    reachable: bool
    loaded: int | None = None
    bytes: int | None = None
    max_bytes: int | None = None
    error: str | None = None


class ConsoleDeployment(BaseModel):
    name: str
    status: str
    message: str
    replicas: dict[str, int] = Field(..., description="replicas by state (RUNNING, STARTING, ...)")


class ConsoleOperate(BaseModel):
    status: Literal["ok", "degraded"]
    ready: bool
    inflight: int
    replica: str | None = Field(None, description="the Router replica that answered (request figures are its own)")
    window_s: float = Field(..., description="the seconds the request figures cover")
    tenants: list[ConsoleTenant]
    unauthenticated: ConsoleRequests | None = Field(None, description="requests without a known key")
    caches: list[ConsoleCache]
    deployments: list[ConsoleDeployment]
    deployments_error: str | None = None
    registry: RegistryStatus
    at: float = Field(..., description="when this was read (Unix seconds)")
