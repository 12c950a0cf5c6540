"""The per-shard BM25 channel: what text a chunk is indexed with, and a saved index searched back."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.index.lexical import ShardLexicon, build_bm25, globalize_idf, lexical_docs

ROWS = [  # (chunk_idx, kind, text, qn) as the shard writer sees them, unfiltered
    (7, "chunk", "The for statement iterates over a sequence.", -1),
    (7, "sentence", "The for statement iterates over a sequence.", -1),
    (7, "question", "What does a for loop iterate over?", 0),
    (7, "quote", "What does a for loop iterate over?", 0),
    (7, "question", "Can a for loop have an else clause?", 1),
    (3, "chunk", "The while statement repeats while a condition holds.", -1),
    (3, "onedoc", "The while statement repeats ...\nWhen does while stop?", -1),
]


def _cols(rows):
    chunk_idx, kinds, texts, qn = zip(*rows, strict=True)
    return np.asarray(chunk_idx, np.int64), list(kinds), list(texts), np.asarray(qn, np.int32)


def test_doc2query_appends_each_distinct_question_once():
    ids, docs = lexical_docs(*_cols(ROWS), doc2query=True)
    assert ids.tolist() == [3, 7]
    assert docs[0] == "The while statement repeats while a condition holds."  # onedoc text is not a question row
    assert docs[1].split("\n") == ["The for statement iterates over a sequence.", "What does a for loop iterate over?",
                                   "Can a for loop have an else clause?"]


def test_without_doc2query_only_the_chunk_text():
    ids, docs = lexical_docs(*_cols(ROWS), doc2query=False)
    assert docs == ["The while statement repeats while a condition holds.",
                    "The for statement iterates over a sequence."]


@pytest.fixture(scope="module")
def lexicon(tmp_path_factory):
    from pydoc_data.topics import topics

    names = ["for", "while", "with", "try", "lambda", "assert"]
    path = tmp_path_factory.mktemp("bm25") / "00000.bm25"
    ids = np.asarray([100 + i for i in range(len(names))], np.int64)
    vocab = build_bm25(ids, [topics[n] for n in names], path, k1=1.5, b=0.75)
    assert vocab > 100
    return ShardLexicon(path), dict(zip(names, ids.tolist(), strict=True)), [topics[n] for n in names]


def test_search_ranks_by_bm25_and_returns_chunk_ids(lexicon):
    import bm25s

    lex, ids, texts = lexicon
    scores, got = lex.search(["What does __exit__ receive in a with statement?", "lambda expressions"], k=3)
    assert scores.shape == got.shape == (2, 3)
    assert got[0, 0] == ids["with"] and got[1, 0] == ids["lambda"]
    assert np.all(np.diff(scores, axis=1) <= 0)
    # the same scores as bm25s computed directly over the same texts
    ref = bm25s.BM25(k1=1.5, b=0.75)
    ref.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    direct = ref.get_scores(bm25s.tokenize(["lambda expressions"], stopwords="en", return_ids=False,
                                           show_progress=False)[0])
    order = np.argsort(-direct)[:3]
    np.testing.assert_allclose(scores[1], direct[order], rtol=1e-5)


def test_no_matching_term_gives_empty_slots(lexicon):
    lex, _, _ = lexicon
    scores, got = lex.search(["the of and", "zyzzyva quux"], k=4)
    assert (got == -1).all() and (scores == 0).all()


def test_k_beyond_the_shard_is_clipped(lexicon):
    lex, _, _ = lexicon
    _, got = lex.search(["statement"], k=50)
    assert got.shape == (1, len(lex))


def test_empty_shard(tmp_path):
    build_bm25(np.zeros(0, np.int64), [], tmp_path / "e.bm25", 1.5, 0.75)
    scores, got = ShardLexicon(tmp_path / "e.bm25").search(["anything"], k=5)
    assert got.shape == (1, 0) and scores.shape == (1, 0)


def _scores_by_chunk(paths, query: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for path in paths:
        lex = ShardLexicon(path)
        scores, ids = lex.search([query], k=len(lex))
        out |= {int(c): float(v) for c, v in zip(ids[0], scores[0], strict=True) if c >= 0}
    return out


def test_global_idf_makes_shards_score_like_one_index(tmp_path):
    """Split into shards, each shard's IDF is its own and the same chunk scores differently than in one
    index; after globalize_idf the scores are the one index's. b = 0 takes the shards' average lengths
    out of the tf part, so the comparison is exact."""
    import shutil
    from pydoc_data.topics import topics

    names = ["for", "while", "with", "try", "lambda", "assert", "if", "import", "return", "raise", "del", "pass"]
    texts = [topics[n] for n in names]
    ids = np.arange(len(names), dtype=np.int64)
    build_bm25(ids, texts, tmp_path / "one.bm25", k1=1.5, b=0.0)
    shards = [tmp_path / f"{s:05d}.bm25" for s in range(3)]
    for shard, path in enumerate(shards):
        sel = ids % 3 == shard
        build_bm25(ids[sel], [t for t, k in zip(texts, sel, strict=True) if k], path, k1=1.5, b=0.0)
    build_bm25(np.zeros(0, np.int64), [], tmp_path / "empty.bm25", 1.5, 0.0)  # an empty shard is skipped
    local = [tmp_path / f"local{s}.bm25" for s in range(3)]
    for path, local_path in zip(shards, local, strict=True):
        shutil.copytree(path, local_path)
    globalize_idf(shards + [tmp_path / "empty.bm25"])
    for query in ["exception raised in the try clause", "iterate over the items of a sequence", "module import"]:
        one = _scores_by_chunk([tmp_path / "one.bm25"], query)
        merged = _scores_by_chunk(shards, query)
        assert sorted(merged) == sorted(one)
        np.testing.assert_allclose([merged[c] for c in sorted(one)], [one[c] for c in sorted(one)], rtol=1e-5)
        per_shard = _scores_by_chunk(local, query)
        assert not np.allclose([per_shard[c] for c in sorted(one)], [one[c] for c in sorted(one)], rtol=1e-3)
    # one shard is already global: nothing is rewritten
    before = (tmp_path / "one.bm25" / "data.csc.index.npy").read_bytes()
    globalize_idf([tmp_path / "one.bm25"])
    assert (tmp_path / "one.bm25" / "data.csc.index.npy").read_bytes() == before


def test_global_idf_refuses_another_idf_before_rewriting_any_shard(tmp_path):
    import json

    shards = [tmp_path / f"{s:05d}.bm25" for s in range(2)]
    for shard, path in enumerate(shards):
        build_bm25(np.array([shard], np.int64), [f"shard {shard} text about loops"], path, 1.5, 0.75)
    params = shards[1] / "params.index.json"
    params.write_text(json.dumps({**json.loads(params.read_text()), "method": "robertson"}))
    before = (shards[0] / "data.csc.index.npy").read_bytes()
    with pytest.raises(ValueError, match="method 'lucene', not 'robertson'"):
        globalize_idf(shards)
    assert (shards[0] / "data.csc.index.npy").read_bytes() == before


# ------------------------------------------------------------------------------------- stemming, by hand

TOY = ["The runner runs quickly", "Running is fun", "Cats sleep all day"]


def _bm25_by_hand(tf: int, dl: int, avgdl: float, df: int, n: int, k1: float, b: float) -> float:
    """Lucene's (>= 8) BM25 term score: idf = ln(1 + (N - df + 0.5) / (df + 0.5)) times
    tf / (tf + k1 (1 - b + b dl / avgdl)) (Lucene 8 dropped the constant (k1 + 1) factor)."""
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))


def test_stemmed_bm25_matches_a_hand_computed_score(tmp_path):
    # stemmed, stopwords out: d0 = runner run quick (3), d1 = run fun (2), d2 = cat sleep all day (4)
    k1 = 0.9
    b = 0.4
    build_bm25(np.asarray([10, 11, 12]), TOY, tmp_path / "s", k1=k1, b=b, stemmer="english")
    lex = ShardLexicon(tmp_path / "s")
    assert lex.stemmer == "english"
    scores, ids = lex.search(["ran? no: runs"], k=3)  # query stems to "ran", "run"; "ran" is in no document
    avgdl = (3 + 2 + 4) / 3
    want = {10: _bm25_by_hand(1, 3, avgdl, 2, 3, k1, b), 11: _bm25_by_hand(1, 2, avgdl, 2, 3, k1, b)}
    assert ids[0, :2].tolist() == [11, 10] and ids[0, 2] == -1  # the shorter document first
    np.testing.assert_allclose(scores[0, :2], [want[11], want[10]], rtol=1e-5)


def test_without_stemming_running_does_not_match_runs(tmp_path):
    build_bm25(np.asarray([10, 11, 12]), TOY, tmp_path / "u", k1=0.9, b=0.4, stemmer=None)
    lex = ShardLexicon(tmp_path / "u")
    _, ids = lex.search(["running"], k=3)
    assert ids[0].tolist() == [11, -1, -1]


def test_an_index_built_before_stemming_keeps_unstemmed_queries(tmp_path):
    from qrag_ray.index.lexical import TOKENIZER

    build_bm25(np.asarray([10, 11, 12]), TOY, tmp_path / "old", k1=0.9, b=0.4, stemmer=None)
    (tmp_path / "old" / TOKENIZER).unlink()  # what an index of the previous release holds
    assert ShardLexicon(tmp_path / "old").stemmer is None


def test_unknown_stemmer_is_a_config_error():
    from pydantic import ValidationError

    from qrag_ray.config.index import Bm25Config

    assert Bm25Config().stemmer == "english" and (Bm25Config().k1, Bm25Config().b) == (0.9, 0.4)
    with pytest.raises(ValidationError, match="unknown stemmer 'klingon'"):
        Bm25Config(stemmer="klingon")


def test_a_stemmed_shard_is_the_same_bytes_whatever_the_hash_seed(tmp_path):
    # bm25s numbers stemmed terms in set order; two builds in processes with other hash seeds must
    # still write identical files, or a rebuilt index gets another content hash
    import hashlib
    import os
    import subprocess
    import sys

    script = ("import sys, numpy as np; from qrag_ray.index.lexical import build_bm25\n"
              "texts = ['Loops run while a condition holds', 'break ends the running loop early',\n"
              "         'else clauses run when loops finish', 'generators yield values lazily']\n"
              "build_bm25(np.arange(4), texts, sys.argv[1], 0.9, 0.4, 'english')\n")
    digests = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        subprocess.run([sys.executable, "-c", script, str(out)], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed})
        digests.append({f.relative_to(out).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
                        for f in sorted(out.rglob("*")) if f.is_file()})
    assert digests[0] and digests[0] == digests[1]
