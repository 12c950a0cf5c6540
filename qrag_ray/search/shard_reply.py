"""A shard's reply to a batch of queries, the one thing a shard search returns, in process or over Serve:
every query's hits (each query's own length, widened or trimmed one by one, so held as flat arrays with each
query's end and pickled as a few arrays, not four per query) and the page metadata of the chunks among them
that can still reach a page (their chunk records and their best rows' kinds and texts), so the caller merges
and formats without asking the shard again. Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.search.merge import ChunkResult, Hits, essential_hits, group_winners, reachable_chunks
from qrag_ray.search.page import ChunkMeta
from qrag_ray.search.query import QueryBatch

MAX_MATCHES = 3  # a result's matched vectors (merge.dedup's max_matches)


def _flat(arrays: list[np.ndarray | None], dtype) -> np.ndarray | None:
    """One array of the queries' arrays end to end; None when no query has one."""
    present = [array is not None for array in arrays]
    if any(present) and not all(present):
        raise ValueError("a hit field is set for some queries of a shard and not for others")
    if not arrays or not all(present):
        return None
    return np.concatenate(arrays).astype(dtype, copy=False)


def _ends(arrays: list[np.ndarray | None]) -> np.ndarray:
    return np.cumsum([0 if array is None else len(array) for array in arrays], dtype=np.int64)


@dataclass
class ShardReply:
    """Query j's vector hits are `scores[ends[j-1]:ends[j]]` (rows, chunk_idx, kinds alike), its BM25 hits
    `lex_scores[lex_ends[j-1]:lex_ends[j]]`; `chunks` and `row_texts` hold the page metadata."""

    shard: int
    scores: np.ndarray
    rows: np.ndarray
    chunk_idx: np.ndarray
    kinds: np.ndarray | None
    ends: np.ndarray
    lex_scores: np.ndarray | None
    lex_chunk_idx: np.ndarray | None
    lex_ends: np.ndarray
    exhausted: np.ndarray  # a bool per query
    chunks: dict[int, ChunkMeta] = field(default_factory=dict)  # chunk_idx -> its record
    row_texts: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, text)
    row_vectors: dict[int, list[float] | None] = field(default_factory=dict)  # row -> its stored vector, when asked
    candidates: list[int] = field(default_factory=list)  # per query: vector hits before the reply trimmed them
    rounds: int = 1  # the widening rounds the deepest query needed
    search_ms: float = 0.0
    cold: bool = False  # the shard was loaded for this call
    replica: str = ""  # the Serve replica that searched it (remote shards)

    @classmethod
    def of(cls, shard: int, hits: Sequence[Hits]) -> ShardReply:
        """One shard's hits, one Hits per query, held flat."""
        return cls(shard, _flat([query.scores for query in hits], np.float32),
                   _flat([query.rows for query in hits], np.int64),
                   _flat([query.chunk_idx for query in hits], np.int64),
                   _flat([query.kinds for query in hits], object), _ends([query.rows for query in hits]),
                   _flat([query.lex_scores for query in hits], np.float32),
                   _flat([query.lex_chunk_idx for query in hits], np.int64),
                   _ends([query.lex_scores for query in hits]),
                   np.array([query.exhausted for query in hits], dtype=bool))

    def __len__(self) -> int:
        """The queries of the batch."""
        return len(self.ends)

    def hits(self, query: int) -> Hits:
        """Query `query`'s hits (views of the flat arrays, no copy)."""
        start = int(self.ends[query - 1]) if query else 0
        end = int(self.ends[query])
        lex_start = int(self.lex_ends[query - 1]) if query else 0
        lex_end = int(self.lex_ends[query])
        return Hits(self.shard, self.scores[start:end], self.rows[start:end], self.chunk_idx[start:end],
                    bool(self.exhausted[query]), None if self.kinds is None else self.kinds[start:end],
                    None if self.lex_scores is None else self.lex_scores[lex_start:lex_end],
                    None if self.lex_chunk_idx is None else self.lex_chunk_idx[lex_start:lex_end])


def page_rows(hits: Hits, chunks: set[int], policy: SearchConfig) -> list[int]:
    """The rows a page shows for `chunks` among one query's hits of one shard: each chunk's best
    MAX_MATCHES vectors in the merge's order (calibrated score, then row; a chunk lives in one shard)."""
    filled = np.flatnonzero((hits.rows >= 0) & np.isin(hits.chunk_idx, list(chunks)))
    if not len(filled):
        return []
    kinds = None if hits.kinds is None else np.asarray(hits.kinds, dtype=object)[filled]
    calibrated = policy.calibrate(hits.scores[filled], kinds)
    order = np.lexsort((hits.rows[filled], -calibrated, hits.chunk_idx[filled]))  # by chunk, best first
    by_chunk = hits.chunk_idx[filled][order]
    starts = np.flatnonzero(np.r_[True, by_chunk[1:] != by_chunk[:-1]])
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return hits.rows[filled][order[rank < MAX_MATCHES]].tolist()


def _only(hits: Hits, chunks: set[int]) -> Hits:
    """The vector hits of only `chunks` (BM25 hits unchanged)."""
    keep = np.isin(hits.chunk_idx, list(chunks))
    return Hits(hits.shard, hits.scores[keep], hits.rows[keep], hits.chunk_idx[keep], hits.exhausted,
                None if hits.kinds is None else hits.kinds[keep], hits.lex_scores, hits.lex_chunk_idx)


def finish_replies(shards: Sequence, searched: Sequence[tuple[list[Hits], list[list[ChunkResult]], int]],
                   batch: QueryBatch, travels: bool) -> list[ShardReply]:
    """The replies of a group of shards (search.shard.Shard objects), from each one's `Shard.search`: per
    query, the chunks of the group that can reach a page (under max fusion without BM25 the group's own top k,
    `group_winners`; else those fewer than k of the group beat, `reachable_chunks`), with their page
    metadata; a reply that `travels`
    carries only the hits the caller's merge reads (under max fusion those chunks' hits, else
    `essential_hits` of every chunk), a reply read in this process all of them."""
    policy = batch.policy
    queries = len(searched[0][0]) if searched else 0
    winners_decide = policy.fusion == "max" and policy.bm25_alpha is None
    if winners_decide:
        reachable = [group_winners([tops[query] for _, tops, _ in searched], batch.k) for query in range(queries)]
    else:
        reachable = [reachable_chunks([hits[query] for hits, _, _ in searched], batch.k, policy)
                     for query in range(queries)]
    replies = []
    for shard, (hits, tops, rounds) in zip(shards, searched, strict=True):
        if not travels:
            sent = hits
        elif winners_decide:
            sent = [_only(query_hits, chunks) for query_hits, chunks in zip(hits, reachable, strict=True)]
        else:
            sent = [essential_hits(query_hits, batch.k, policy) for query_hits in hits]
        reply = ShardReply.of(shard.number, sent)
        reply.candidates = [int((query_hits.rows >= 0).sum()) for query_hits in hits]
        reply.rounds = rounds
        mine: set[int] = set()
        rows: list[int] = []
        for query_hits, top, chunks in zip(sent, tops, reachable, strict=True):
            if winners_decide:  # the shard's own top k holds its winners with their matched rows
                page = [result for result in top if result.chunk_idx in chunks]
                mine.update(result.chunk_idx for result in page)
                rows += [row for result in page for _, row, _ in result.matches]
                continue
            held = set(query_hits.chunk_idx.tolist())
            if query_hits.lex_chunk_idx is not None:
                held.update(query_hits.lex_chunk_idx.tolist())
            page_chunks = chunks & held
            mine |= page_chunks
            rows += page_rows(query_hits, page_chunks, policy)
        mine.discard(-1)
        reply.chunks = shard.fetch_chunks(sorted(mine))
        # a chunk row's text is its chunk's text: one string object for both, so the reply pickles it once
        same = {meta.text: meta.text for meta in reply.chunks.values()}
        reply.row_texts = {row: (kind, same.get(text, text))
                           for row, (kind, text) in shard.fetch_rows(sorted(set(rows))).items()}
        if batch.vectors:
            reply.row_vectors = shard.fetch_vectors(sorted(set(rows)))
        replies.append(reply)
    return replies
