"""Serve application args (`args:` of a serve config, or `qrag serve` flags), typed and pure: `serve
deploy`, `qrag serve` and the RayService manifest fail the same way on a typo instead of serving defaults."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qrag_ray.config.index import format_validation_error
from qrag_ray.config.llm import LLMConfig
from qrag_ray.errors import QragError
from qrag_ray.runtime.ports import free_port
from qrag_ray.serving.tenants import RateLimit, Tenants, load_tenants

# Deployment names, fixed: serve configs refer to them under `deployments:` (and to ShardSearcher0..G-1, G the
# shard groups: args.shards / args.shards_per_searcher, rounded up).
ROUTER = "Router"
SYNTHESIZER = "Synthesizer"
WRITER = "Writer"

# RAY_SERVE_THROUGHPUT_OPTIMIZED's switches but direct ingress (which wants HAProxy in front). Ray reads
# them when each process starts, so `qrag serve` sets them before it starts Ray, and the manifests on every pod.
SERVE_PROCESS_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",  # our handlers are async and offload FAISS/torch
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",  # access-log lines written in batches
    "RAY_SERVE_LOG_TO_STDERR": "0",  # replica logs go to their files only
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",  # Router -> ShardSearcher calls over gRPC
    # a handle call's reply over gRPC may be as large as a page of k=1000 results with their texts and
    # metadata (several MB; a shard group's reply to a batch of queries more): gRPC's 4 MiB default, which
    # Serve keeps, fails such a reply with RESOURCE_EXHAUSTED (an HTTP 500 to the user)
    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(512 * 2**20),
}

# The RayService's ingress (on every pod, besides SERVE_PROCESS_ENV): Serve's HAProxy on the Serve port, in front
# of the Router replicas' own HTTP ports, which costs less CPU per request than Serve's Python proxy. Its files
# are under /tmp by Ray's default (the pods' emptyDir: their root filesystem is read-only). HAProxy does not
# apply http_options.request_timeout_s and by default waits on a replica forever, so its server timeout is that
# same bound (the manifest check holds them equal).
CLUSTER_INGRESS_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S": "60"}


def haproxy_env() -> dict[str, str]:
    """Serve's HAProxy ingress for a Ray started on this machine: its files in a new folder of its own
    under the temp dir (a short path: Serve adds a 56-character folder, and HAProxy refuses a socket path
    over 97 characters; `RAY_SERVE_HAPROXY_SERVER_STATE_BASE` names it for removal) and its metrics and
    stats on free ports, so two servers on one machine do not collide."""
    folder = Path(tempfile.mkdtemp(prefix="qh-"))
    return {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(folder / "metrics.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port())}


def assigned_resources() -> dict[str, float]:
    """What Ray scheduled the calling replica for ({} outside Ray): its CPUs and GPUs."""
    try:
        import ray

        return dict(ray.get_runtime_context().get_assigned_resources())
    except Exception:
        return {}


def assigned_device() -> str:
    """"cuda" when Ray gave the replica a GPU (`ray_actor_options: {num_gpus: 1}`), else "cpu" (outside Ray too)."""
    return "cuda" if assigned_resources().get("GPU") else "cpu"


def assigned_cpus() -> int:
    """The replica's CPU share (1 outside Ray), so FAISS / torch threads match what Ray scheduled it for."""
    return max(1, int(round(assigned_resources().get("CPU") or 1)))


def replica_id() -> str:
    """This Serve replica's id ('' outside a replica): what responses and status name a replica by."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return ""


class WriteSettings(BaseModel):
    """The write routes' bounds and the Writer's delta and compaction policy (docs/SERVING.md, "Writing to a
    tenant")."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="deploy the Writer and take writes (false: the write routes answer 409)")
    max_documents: int = Field(1000, ge=1, description="documents (or ids) one write request may carry (413 beyond)")
    max_bytes: int = Field(8 << 20, ge=1 << 10, description="bytes one write request's body may have (413 beyond)")
    max_queued_bytes: int = Field(
        256 << 20, ge=1 << 10, description="bytes of a tenant's logged writes not yet applied; a write beyond it gets "
                                           "429 write_backlog with Retry-After")
    scan_s: float = Field(2.0, gt=0, le=300, description="how often the Writer looks at every tenant's log besides "
                                                         "the Routers' nudges (a restarted Writer replays at once)")
    max_entries: int = Field(256, ge=1, description="log entries the Writer folds into one delta at most")
    merge_factor: int = Field(
        4, ge=2, description="this many newest deltas of one size tier (sizes within this factor) merge into one, so "
                             "a tenant keeps a few deltas of growing size and a chunk is rewritten about log(n) times")
    max_deltas: int = Field(16, ge=1, description="deltas beyond this are merged whatever their sizes")
    compact_vectors: int = Field(
        200_000, ge=1, description="compact a tenant (fold its deltas and deletions into a new index version) once "
                                   "its deltas hold this many vectors")
    compact_age_s: float = Field(3600.0, gt=0, description="... or once its oldest delta or deletion is this old")
    auto_compact: bool = Field(True, description="the Writer starts those compactions itself (`qrag compact ROOT` "
                                                 "runs one by hand either way)")
    retire_s: float = Field(60.0, ge=0, description="how long a delta replaced by a merge or a compaction stays on "
                                                    "disk for the replicas still searching it")
    status_retention_s: float = Field(86400.0, gt=0, description="how long a write's status stays readable")


class AppArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: str | None = Field(None, description="one index served as the open default tenant")
    tenants: str | None = Field(None, description="tenants YAML (name, index, key_sha256); every request needs a key")
    shards: int | None = Field(None, ge=1, le=256, description="shard numbers served; default: the most shards of "
                                                               "any tenant index")
    shards_per_searcher: int = Field(
        1, ge=1, le=256, description="consecutive shard numbers one ShardSearcher deployment searches: a query makes "
                                     "one call per deployment, so bigger groups mean fewer hops and bigger replicas")
    shard_cache_bytes: int = Field(
        2 << 30, ge=1 << 20, description="bytes of loaded tenant shards one ShardSearcher replica keeps (LRU)")
    tenant_affinity: bool = Field(True, description="route a tenant's shard calls to the ShardSearcher replicas that "
                                                    "hold them (Serve model multiplexing); off: any replica")
    local_search_max_bytes: int = Field(
        64 << 20, ge=0, description="tenants whose index files total at most this are searched inside the Router "
                                    "replica (no shard hop); bigger ones fan out to the ShardSearcher deployments")
    router_cache_bytes: int = Field(
        1 << 30, ge=0, description="bytes of small tenants' shards a Router replica keeps (LRU)")
    faiss_threads: int | None = Field(
        None, ge=1, description="FAISS threads per shard search (default 1; a replica runs as many searches "
                                "at once as its num_cpus)")
    generator: LLMConfig | None = Field(None, description="LLM for mode=hyde and /v1/answer (backend openai or vllm)")
    answer_min_cosine: float = Field(
        0.35, ge=-1.0, le=1.0, description="/v1/answer says \"I don't know\" without asking the LLM when no retrieved "
                                           "chunk has a vector this similar to the query (raw cosine, whatever the "
                                           "fusion)")
    hyde_max_tokens: int = Field(128, ge=1, le=2048)
    request_timeout_s: float = Field(
        10.0, gt=0, le=600, description="deadline of one request across embedding, shard fan-out and the LLM")
    max_inflight: int = Field(96, ge=1, description="requests one Router replica works on at once; more get 503")
    tenants_reload_s: float = Field(
        2.0, ge=0.1, le=300, description="how often the tenants file and index pointers are re-read")
    warm_tenants: int = Field(
        8, ge=0, description="tenants loaded on every shard at start-up (the rest load on first use)")
    default_rate_limit: RateLimit | None = Field(None, description="per-tenant limit for tenants without their own")
    console: bool = Field(False, description="serve the browser console at /console (`qrag serve` turns it on "
                                             "unless --no-console; a deployed config must say `console: true`)")
    writes: WriteSettings = Field(default_factory=WriteSettings, description="the write routes and the Writer")

    @model_validator(mode="after")
    def _one_source(self) -> "AppArgs":
        if (self.index is None) == (self.tenants is None):
            raise ValueError("give exactly one of 'index' (one open index) or 'tenants' (a tenants file)")
        if self.generator is not None:
            self.generator.check_endpoint()
        return self

    def load_tenants(self) -> Tenants:
        if self.index is not None:
            return Tenants.single(str(Path(self.index).expanduser().resolve()))
        return load_tenants(self.tenants)


def parse_app_args(args: AppArgs | dict[str, Any] | None) -> AppArgs:
    """The serve app's args in their typed form (one line naming the mistake when they are wrong)."""
    if isinstance(args, AppArgs):
        return args
    try:
        return AppArgs.model_validate(args or {})
    except ValidationError as error:
        msg = format_validation_error(error).removeprefix("invalid configuration: ")
        raise QragError(f"invalid serve app args: {msg}") from None
