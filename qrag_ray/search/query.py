"""A query batch as every search path runs it, and its checks before any shard is asked: k within MAX_K
(one limit for the CLI, `qrag eval` and HTTP), a hybrid policy only on an index with a BM25 channel, a
filter checked against the index's metadata schema (search/filters.py)."""

from __future__ import annotations

from dataclasses import dataclass

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.errors import QragError
from qrag_ray.index.format import Manifest
from qrag_ray.search.filters import Filter

MAX_K = 1000


class NoBm25Index(QragError):
    """Hybrid search asked of an index built without a BM25 channel."""


def validate_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1 or k > MAX_K:
        raise QragError(f"k must be between 1 and {MAX_K}, got {k}")
    return k


def check_hybrid(policy: SearchConfig, manifest: Manifest, name: str | None = None) -> None:
    """Hybrid search needs the BM25 files: the one check, for the engine, the CLI and the Router."""
    if policy.bm25_alpha is not None and not manifest.has_bm25:
        raise NoBm25Index(f"hybrid search (bm25_alpha) needs a BM25 index, and {name or manifest.path} has none: "
                          "re-index it with bm25.enabled")


@dataclass(frozen=True)
class Tombstones:
    """Where a segment of a written index (its base version or one of its deltas) finds the documents it must
    leave out: the tombstones of the root's write state (qrag_ray.index.write_state), read by whichever
    process searches the segment, so a request carries three values, not the documents."""

    root: str  # the versioned root whose writes/STATE holds them
    generation: int  # the write generation the request started on (a replica reads at least this one)
    segment_seq: int  # the segment's newest sequence number: documents written after it are hidden there


@dataclass(frozen=True)
class QueryBatch:
    """What every shard runs for a batch of query vectors, resolved once against an index version: the
    batch's k, score floor, policy, words and filter (one query vector per row of the caller's array). A
    lone request is a batch of one."""

    k: int
    min_score: float | None
    policy: SearchConfig  # the index's policy, or it with the request's bm25_alpha, checked against the index
    texts: tuple[str, ...] | None = None  # the user's own words per query vector, for BM25 (hybrid policies)
    filter: Filter | None = None  # metadata filter and doc_ids, checked against the index (search/filters.py)
    vectors: bool = False  # each result also carries its best-matching row's stored vector
    tombstones: Tombstones | None = None  # a written index's segment: the documents it leaves out

    def __post_init__(self) -> None:
        validate_k(self.k)
