"""The retrieval core (qrag_ray.search.retrieve) over fake shard backends: no Ray, no FAISS, no model.
Every search path (`qrag search`, `qrag eval`, the Router) goes through `retrieve`, so its merge, page
lookup and checks are tested here once."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import numpy as np
import pytest

from qrag_ray.errors import QragError
from qrag_ray.index.format import shard_of
from qrag_ray.index.shard_index import ShardHits
from qrag_ray.search.query import MAX_K, Query
from qrag_ray.search.page import ChunkMeta
from qrag_ray.search.retrieve import retrieve
from qrag_ray.search.shard_search import ShardReply
from qrag_ray.config.search_policy import SearchConfig

PKG = Path(__file__).resolve().parents[2] / "qrag_ray"


def _chunks_in(shard: int, n: int, num_shards: int = 2) -> list[int]:
    return [c for c in range(100) if shard_of(c, num_shards) == shard][:n]


class FakeShards:
    """Two shards, one vector (row) per chunk; each query's scores given as {chunk: score}. `page`: send
    the page's metadata with the hits, as remote shard replicas do."""

    def __init__(self, per_query: list[dict[int, float]], page: bool):
        self.per_query, self.page = per_query, page
        self.lookups: list[dict] = []
        chunks = sorted({ch for hits in per_query for ch in hits})
        self.rows = {(s, row): (ch, f"a question {ch} answers") for s in (0, 1)
                     for row, ch in enumerate(c for c in chunks if shard_of(c, 2) == s)}

    def _hits(self, shard: int, qi: int) -> ShardHits:
        vec = [(self.per_query[qi][ch], row, ch) for (s, row), (ch, _) in self.rows.items() if s == shard]
        vec.sort(key=lambda t: -t[0])
        a = lambda xs, dt: np.asarray([xs], dtype=dt)  # noqa: E731
        return ShardHits(shard, a([v[0] for v in vec], np.float32), a([v[1] for v in vec], np.int64),
                         a([v[2] for v in vec], np.int64), exhausted=True, kinds=a(["question"] * len(vec), object))

    def meta(self, ch: int) -> ChunkMeta:
        return ChunkMeta(f"d{ch}#0", f"d{ch}", f"title {ch}", f"text of chunk {ch}")

    async def search(self, key, num_shards, qvecs, q):
        replies = []
        for s in range(num_shards):
            hits = [self._hits(s, qi) for qi in range(len(qvecs))]
            r = ShardReply(s, hits, candidates=[int((h.rows >= 0).sum()) for h in hits])
            if self.page:
                for h in r.hits:
                    for row, ch in zip(h.rows[0].tolist(), h.chunk_idx[0].tolist()):
                        r.matched[row] = ("question", self.rows[(s, row)][1])
                        r.chunks[ch] = self.meta(ch)
            replies.append(r)
        return replies

    async def lookup(self, key, want):
        self.lookups.append(want)
        return [({row: ("question", self.rows[(s, row)][1]) for row in rows}, {c: self.meta(c) for c in cis})
                for s, (rows, cis) in want.items()]


A, B = _chunks_in(0, 2)
C, D = _chunks_in(1, 2)
HITS = [{A: 0.9, B: 0.5, C: 0.8, D: 0.7}, {A: 0.1, B: 0.6, C: 0.2, D: 0.95}]


@pytest.mark.parametrize("page", [False, True])
def test_pages_merge_all_shards_per_query(page):
    backend = FakeShards(HITS, page)
    r = asyncio.run(retrieve(backend, "v1", 2, np.zeros((2, 4), np.float32), Query(3, None, SearchConfig())))
    assert [[h.doc_id for h in p] for p in r.pages] == [[f"d{A}", f"d{C}", f"d{D}"], [f"d{D}", f"d{B}", f"d{C}"]]
    first = r.pages[0][0]
    assert (first.score, first.title, first.text) == (pytest.approx(0.9), f"title {A}", f"text of chunk {A}")
    assert [(m.kind, m.text) for m in first.matched] == [("question", f"a question {A} answers")]
    assert list(first.to_json()) == ["chunk_id", "doc_id", "title", "score", "text", "matched", "cosine"]  # no bm25: dense
    # an in-process backend sends hits only: the page is looked up once for all queries; a remote one
    # sends the page with the hits, and nothing is asked twice
    assert len(backend.lookups) == (0 if page else 1)
    assert len(r.replies) == 2 and r.rounds == 1


def test_min_score_and_fewer_chunks_than_k():
    r = asyncio.run(retrieve(FakeShards(HITS, False), None, 2, np.zeros((1, 4), np.float32),
                             Query(10, 0.75, SearchConfig())))
    assert [h.doc_id for h in r.pages[0]] == [f"d{A}", f"d{C}"]


def test_hybrid_needs_the_query_texts():
    with pytest.raises(QragError, match="needs the query texts"):
        asyncio.run(retrieve(FakeShards(HITS, False), None, 2, np.zeros((1, 4), np.float32),
                             Query(3, None, SearchConfig(bm25_alpha=0.5))))


@pytest.mark.parametrize("k", [0, MAX_K + 1, True])
def test_k_is_checked_once_for_every_path(k):
    with pytest.raises(QragError, match=f"between 1 and {MAX_K}"):
        Query(k, None, SearchConfig())


def test_bm25_alpha_override_is_validated_by_the_policy_type():
    assert SearchConfig(fusion="rrf").with_bm25_alpha(0.25).model_dump() == SearchConfig(
        fusion="rrf", bm25_alpha=0.25).model_dump()
    with pytest.raises(QragError, match=r"bm25_alpha must lie in \[0, 1\], got 1.5"):
        SearchConfig().with_bm25_alpha(1.5)


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def _calls_the_core(source: str) -> bool:
    """The module imports `retrieve` from the core (search/retrieve.py), defines no name of its own that
    shadows it, and calls it by that name."""
    tree = ast.parse(source)
    imported = any(isinstance(n, ast.ImportFrom) and n.module == "qrag_ray.search.retrieve"
                   and any(a.name == "retrieve" and a.asname is None for a in n.names) for n in tree.body)
    shadowed = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == "retrieve"
                   for n in tree.body)
    called = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "retrieve"
                 for n in ast.walk(tree))
    return imported and called and not shadowed


def test_every_search_path_is_the_core():
    """`qrag search` / `qrag eval` (the engine) and the Router rank through the core's `retrieve`, and
    nothing else in the package merges shard hits or searches a shard: there is no second search path."""
    for f in (PKG / "search" / "engine.py", PKG / "serving" / "query_batch.py"):
        assert _calls_the_core(f.read_text()), f
    core = "from qrag_ray.search.retrieve import retrieve\n"
    assert _calls_the_core(core + "retrieve(1)\n")
    assert not _calls_the_core(core + "def retrieve(*a):\n    pass\nretrieve(1)\n")  # its own retrieve
    assert not _calls_the_core(core.replace("search.retrieve", "search.other") + "retrieve(1)\n")
    core_files = {PKG / "search" / n for n in ("retrieve.py", "shard_search.py", "merge.py")}
    for f in PKG.rglob("*.py"):
        if f not in core_files:
            assert not _calls(f) & {"merge_hits", "search_shard_exact", "dedup"}, f
