"""The values the Router and the shard stores pass each other (pickled across Serve calls)."""

from __future__ import annotations

from dataclasses import dataclass, field

from qrag_ray.errors import IndexFormatError
from qrag_ray.search.merge import FusionPolicy


class VersionMoved(IndexFormatError):
    """The directory a request named now holds another index version (a plain index directory was
    republished in place); the router re-resolves the tenant and retries once."""


@dataclass(frozen=True)
class ShardKey:
    """Exactly what to search: one version on every shard, and no tenant table in the shard replicas."""

    tenant: str
    index_dir: str  # the directory holding manifest.json (a version directory under a versioned root)
    version: str  # the index_version the request was started with


@dataclass(frozen=True)
class Query:
    """One search, resolved once against the tenant's index version: what every shard runs."""

    text: str  # the text embedded (the query, or its HyDE passage)
    k: int
    min_score: float | None
    policy: FusionPolicy  # the index's fusion policy with the request's bm25_alpha, checked against the index
    lexical: str | None = None  # the user's own words, for BM25, when the policy is hybrid


@dataclass
class ShardReply:
    shard: int
    hits: list  # one ShardHits per query vector, each final for this shard's top k
    matched: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, text)
    chunks: dict[int, dict] = field(default_factory=dict)  # chunk_idx -> meta
    search_ms: float = 0.0
    rounds: int = 1
