"""The retrieval core (qrag_ray.search.retrieve) over a stand-in shard backend (no Ray, no FAISS, no model):
every search path (`qrag search`, `qrag eval`, the Router) goes through `retrieve`, so its merge, its page
built from the replies alone and its checks are tested here once."""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path

import numpy as np
import pytest

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.errors import QragError
from qrag_ray.index.format import shard_of
from qrag_ray.search import retrieve as retrieve_module
from qrag_ray.search.merge import Hits
from qrag_ray.search.page import ChunkMeta
from qrag_ray.search.query import MAX_K, QueryBatch
from qrag_ray.search.retrieve import retrieve
from qrag_ray.search.shard_reply import ShardReply

PKG = Path(__file__).resolve().parents[2] / "qrag_ray"


def _chunks_in(shard: int, count: int, num_shards: int = 2) -> list[int]:
    return [chunk for chunk in range(100) if shard_of(chunk, num_shards) == shard][:count]


class StandInShards:
    """Two shards, one vector (row) per chunk; each query's scores given as {chunk: score}. Its replies carry
    their page metadata, as every shard reply does; it has nothing but `search` to be asked."""

    def __init__(self, per_query: list[dict[int, float]]):
        self.per_query = per_query
        self.calls = 0
        chunks = sorted({chunk for hits in per_query for chunk in hits})
        self.rows = {(shard, row): (chunk, f"a question {chunk} answers") for shard in (0, 1)
                     for row, chunk in enumerate(c for c in chunks if shard_of(c, 2) == shard)}

    def _hits(self, shard: int, query: int) -> Hits:
        found = [(self.per_query[query][chunk], row, chunk) for (s, row), (chunk, _) in self.rows.items() if s == shard]
        found.sort(key=lambda hit: -hit[0])
        return Hits(shard, np.asarray([hit[0] for hit in found], np.float32),
                    np.asarray([hit[1] for hit in found], np.int64), np.asarray([hit[2] for hit in found], np.int64),
                    exhausted=True, kinds=np.asarray(["question"] * len(found), object))

    @staticmethod
    def meta(chunk: int) -> ChunkMeta:
        return ChunkMeta(f"d{chunk}#0", f"d{chunk}", f"title {chunk}", f"text of chunk {chunk}")

    async def search(self, key, num_shards, vectors, batch):
        self.calls += 1
        replies = []
        for shard in range(num_shards):
            hits = [self._hits(shard, query) for query in range(len(vectors))]
            reply = ShardReply.of(shard, hits)
            reply.candidates = [len(query_hits.rows) for query_hits in hits]
            for query_hits in hits:
                for row, chunk in zip(query_hits.rows.tolist(), query_hits.chunk_idx.tolist(), strict=True):
                    reply.row_texts[row] = ("question", self.rows[(shard, row)][1])
                    reply.chunks[chunk] = self.meta(chunk)
            replies.append(reply)
        return replies


CHUNK_A, CHUNK_B = _chunks_in(0, 2)
CHUNK_C, CHUNK_D = _chunks_in(1, 2)
HITS = [{CHUNK_A: 0.9, CHUNK_B: 0.5, CHUNK_C: 0.8, CHUNK_D: 0.7},
        {CHUNK_A: 0.1, CHUNK_B: 0.6, CHUNK_C: 0.2, CHUNK_D: 0.95}]


def test_pages_merge_all_shards_per_query_from_one_call():
    backend = StandInShards(HITS)
    found = asyncio.run(retrieve(backend, "v1", 2, np.zeros((2, 4), np.float32), QueryBatch(3, None, SearchConfig())))
    doc_ids = [[result.doc_id for result in page] for page in found.pages]
    assert doc_ids == [[f"d{CHUNK_A}", f"d{CHUNK_C}", f"d{CHUNK_D}"], [f"d{CHUNK_D}", f"d{CHUNK_B}", f"d{CHUNK_C}"]]
    first = found.pages[0][0]
    assert first.score == pytest.approx(0.9)
    assert (first.title, first.text) == (f"title {CHUNK_A}", f"text of chunk {CHUNK_A}")
    assert [(match.kind, match.text) for match in first.matched] == [("question", f"a question {CHUNK_A} answers")]
    assert list(first.to_json()) == ["chunk_id", "doc_id", "title", "score", "text", "matched", "cosine"]  # no bm25
    assert backend.calls == 1 and len(found.replies) == 2 and found.rounds == 1


def test_retrieve_asks_the_shards_once():
    """fan out -> merge -> format: the core's one call to a backend is its search."""
    tree = ast.parse(inspect.getsource(retrieve_module.retrieve))
    backend_calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                     and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                     and node.func.value.id == "backend"]
    assert [call.func.attr for call in backend_calls] == ["search"]


def test_min_score_and_fewer_chunks_than_k():
    found = asyncio.run(retrieve(StandInShards(HITS), None, 2, np.zeros((1, 4), np.float32),
                                 QueryBatch(10, 0.75, SearchConfig())))
    assert [result.doc_id for result in found.pages[0]] == [f"d{CHUNK_A}", f"d{CHUNK_C}"]


def test_hybrid_needs_the_query_texts():
    with pytest.raises(QragError, match="needs the query texts"):
        asyncio.run(retrieve(StandInShards(HITS), None, 2, np.zeros((1, 4), np.float32),
                             QueryBatch(3, None, SearchConfig(bm25_alpha=0.5))))


@pytest.mark.parametrize("k", [0, MAX_K + 1, True])
def test_k_is_checked_once_for_every_path(k):
    with pytest.raises(QragError, match=f"between 1 and {MAX_K}"):
        QueryBatch(k, None, SearchConfig())


def test_bm25_alpha_override_is_validated_by_the_policy_type():
    assert SearchConfig(fusion="rrf").with_bm25_alpha(0.25).model_dump() == SearchConfig(
        fusion="rrf", bm25_alpha=0.25).model_dump()
    with pytest.raises(QragError, match=r"bm25_alpha must lie in \[0, 1\], got 1.5"):
        SearchConfig().with_bm25_alpha(1.5)


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "")
    return names


def _names(path: Path) -> set[str]:
    """Every name the module reads (a function called, or handed to a thread)."""
    return {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}


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
    for module_path in (PKG / "search" / "engine.py", PKG / "serving" / "search_passes.py"):
        assert _calls_the_core(module_path.read_text()), module_path
    core = "from qrag_ray.search.retrieve import retrieve\n"
    assert _calls_the_core(core + "retrieve(1)\n")
    assert not _calls_the_core(core + "def retrieve(*a):\n    pass\nretrieve(1)\n")  # its own retrieve
    assert not _calls_the_core(core.replace("search.retrieve", "search.other") + "retrieve(1)\n")
    core_files = {PKG / "search" / name for name in ("retrieve.py", "shard.py", "shard_reply.py", "merge.py")}
    for module_path in PKG.rglob("*.py"):
        if module_path not in core_files:
            assert not _calls(module_path) & {"merge_hits", "dedup", "finish_replies"}, module_path
    searchers = {f.relative_to(PKG).as_posix() for f in PKG.rglob("*.py") if "search_shards" in _names(f)
                 and f.name != "shard.py"}
    assert searchers == {"search/retrieve.py", "serving/shard_searcher.py"}  # in process, and over Serve
