"""One shard's vector hits for a batch of queries as a shard replica sends them: each query's hits have
their own length (widened or trimmed one by one), so they are held as flat arrays with each query's end,
trimmed in one vectorised pass (`only_chunks`) and pickled as a few arrays, not four per query. Indexing
gives a query's hits as the 1-query ShardHits the merge reads (views, no copy). Pure numpy."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from qrag_ray.index.shard_index import ShardHits

_VECTOR = ("scores", "rows", "chunk_idx", "kinds")  # one entry per vector hit
_LEXICAL = ("lex_scores", "lex_chunk_idx")  # one entry per BM25 hit
_NO_CHUNK = np.iinfo(np.int64).min  # never a chunk key, nor the -1 of an empty slot


def _flat(hits: Sequence[ShardHits], names: tuple[str, ...]) -> dict[str, np.ndarray | None]:
    out: dict[str, np.ndarray | None] = {}
    for name in names:
        arrays = [getattr(h, name) for h in hits]
        present = [a is not None for a in arrays]
        if any(present) and not all(present):
            raise ValueError(f"{name} is set for some queries of a shard and not for others")
        out[name] = np.concatenate([a[0] for a in arrays]) if all(present) and arrays else None
    return out


class HitRows(Sequence[ShardHits]):
    """Query j's hits are `self[j]`; `vector[name][ends[j-1]:ends[j]]` in flat form (lexical alike)."""

    def __init__(self, shard: int, vector: dict[str, np.ndarray | None], ends: np.ndarray,
                 lexical: dict[str, np.ndarray | None], lex_ends: np.ndarray, exhausted: np.ndarray):
        self.shard, self.vector, self.ends = shard, vector, ends
        self.lexical, self.lex_ends, self.exhausted = lexical, lex_ends, exhausted

    @classmethod
    def of(cls, shard: int, hits: Sequence[ShardHits]) -> HitRows:
        """1-query ShardHits of one shard, one per query, flattened."""
        ends = np.cumsum([h.rows.shape[1] for h in hits], dtype=np.int64)
        lex_ends = np.cumsum([0 if h.lex_scores is None else h.lex_scores.shape[1] for h in hits], dtype=np.int64)
        return cls(shard, _flat(hits, _VECTOR), ends, _flat(hits, _LEXICAL), lex_ends,
                   np.array([h.exhausted for h in hits], dtype=bool))

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, j):  # type: ignore[override]
        if not isinstance(j, (int, np.integer)):
            raise TypeError("HitRows are indexed by query number")
        if not -len(self) <= j < len(self):
            raise IndexError(j)
        j = int(j) % len(self)
        s, e = (int(self.ends[j - 1]) if j else 0), int(self.ends[j])
        ls, le = (int(self.lex_ends[j - 1]) if j else 0), int(self.lex_ends[j])
        v = {n: None if a is None else a[None, s:e] for n, a in self.vector.items()}
        lx = {n: None if a is None else a[None, ls:le] for n, a in self.lexical.items()}
        return ShardHits(self.shard, v["scores"], v["rows"], v["chunk_idx"], bool(self.exhausted[j]), v["kinds"],
                         lx["lex_scores"], lx["lex_chunk_idx"])

    def __iter__(self) -> Iterator[ShardHits]:
        return (self[j] for j in range(len(self)))

    def query_of_hit(self) -> np.ndarray:
        """The query number of each flat vector hit."""
        return np.repeat(np.arange(len(self)), np.diff(self.ends, prepend=0))

    def keep(self, mask: np.ndarray) -> HitRows:
        """Only the vector hits where `mask` (one bool per flat hit) is set; BM25 lists unchanged."""
        ends = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])[self.ends]  # hits kept up to each query's end
        vector = {n: None if a is None else a[mask] for n, a in self.vector.items()}
        return HitRows(self.shard, vector, ends, self.lexical, self.lex_ends, self.exhausted)


def only_chunks(hits: HitRows, chunks: Sequence[set[int]]) -> HitRows:
    """Query j's vector hits of only the chunks in chunks[j] (the rest of its vectors dropped), for every
    query of the shard in one pass."""
    cidx = hits.vector["chunk_idx"]
    if cidx is None or not len(cidx):
        return hits
    wanted = np.full((len(hits), max(1, max(map(len, chunks), default=0))), _NO_CHUNK, dtype=np.int64)
    for j, c in enumerate(chunks):
        wanted[j, :len(c)] = np.fromiter(c, np.int64, len(c))
    return hits.keep((wanted[hits.query_of_hit()] == cidx[:, None]).any(axis=1))
