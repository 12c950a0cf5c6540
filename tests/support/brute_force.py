"""Exact answers over a loaded index, computed plainly here (numpy over every stored vector, bm25s's own
scores), for the filter tests to hold the search to: the best chunks among those a predicate chooses."""

from __future__ import annotations

import datetime as dt

import numpy as np


def _datetime(text: str) -> dt.datetime:
    """An ISO-8601 datetime as the filters compare it (a Z suffix is UTC)."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def passes(node: dict, meta: dict) -> bool:
    """The filter grammar's meaning written out plainly (the oracle the vectorised evaluation is held to):
    a list matches eq/in when any element does; ne/nin are the negations of eq/in; ISO-8601 text compares
    as the date or datetime it names."""
    if node["type"] in ("and", "or"):
        got = [passes(c, meta) for c in node["filters"]]
        return all(got) if node["type"] == "and" else any(got)
    operator = node["type"]
    if operator in ("ne", "nin"):
        return not passes({**node, "type": "eq" if operator == "ne" else "in"}, meta)
    value = meta.get(node["key"])
    want = node["value"]
    if value is None:
        return False
    vals = value if isinstance(value, list) else [value]
    if isinstance(vals[0], str) and "T" in vals[0] and vals[0][:4].isdigit():  # a datetime field
        vals = [_datetime(x) for x in vals]
        want = [_datetime(w) for w in want] if operator == "in" else _datetime(want)
    test = {"eq": lambda x: x == want, "in": lambda x: x in want, "gt": lambda x: x > want,
            "gte": lambda x: x >= want, "lt": lambda x: x < want, "lte": lambda x: x <= want}[operator]
    return any(test(x) for x in vals)


def dense_truth(engine, qvecs: np.ndarray, chosen: set[str]) -> list[list[tuple[str, float]]]:
    """Per query: (chunk id, best cosine of its stored vectors) of every chunk of the `chosen` documents,
    best first (max fusion), from every vector of every shard of a SearchEngine."""
    best: list[dict[str, float]] = [{} for _ in qvecs]
    for shard in engine.shards:
        vecs = shard.faiss.reconstruct_n(0, shard.ntotal)
        ids = dict(zip(shard.chunk_idx.tolist(), shard.chunk_columns[0].to_pylist(), strict=True))
        docs = dict(zip(shard.chunk_idx.tolist(), shard.chunk_columns[1].to_pylist(), strict=True))
        scores = qvecs @ vecs.T
        for row, chunk_idx in enumerate(shard.row_chunks.tolist()):
            if docs[chunk_idx] in chosen:
                for query in range(len(qvecs)):
                    best[query][ids[chunk_idx]] = max(best[query].get(ids[chunk_idx], -9.0), float(scores[query, row]))
    return [sorted(b.items(), key=lambda t: (-t[1], t[0])) for b in best]


def bm25_truth(engine, query: str, chosen: set[str]) -> tuple[list[tuple[str, float]], list[list[float]]]:
    """(the chosen chunks with a positive BM25 score, best first; per shard every chosen chunk's score)."""
    from qrag_ray.index.lexical import tokenize

    out = []
    per_shard = []
    for shard in engine.shards:
        lex = shard.lexicon
        ids = dict(zip(shard.chunk_idx.tolist(), shard.chunk_columns[0].to_pylist(), strict=True))
        docs = dict(zip(shard.chunk_idx.tolist(), shard.chunk_columns[1].to_pylist(), strict=True))
        toks = tokenize([query], ids=False, stemmer=lex.stemmer)[0]
        scores = np.asarray(lex.bm25.get_scores(toks)) if toks else np.zeros(len(lex))
        mine = [(ids[ci], float(s)) for ci, s in zip(lex.chunk_idx.tolist(), scores, strict=True) if docs[ci] in chosen]
        per_shard.append([s for _, s in mine])
        out += [(c, s) for c, s in mine if s > 0]
    return sorted(out, key=lambda t: -t[1]), per_shard
