"""Chunk + its questions/atoms -> the rows to embed (pure).

Every chunk always gets a `chunk` row: stored when the representation includes chunks, otherwise kept
as an auxiliary vector (store=False) that the shard writer uses for question-chunk filters and as the
fallback that keeps a chunk reachable when all its questions were filtered out. `qn` links a quote
vector to its question so filters decided on the question apply to both.
"""

from __future__ import annotations

import re

_NORM = re.compile(r"[^a-z0-9]+")


def norm_question(q: str) -> str:
    return _NORM.sub(" ", q.lower()).strip()


def dedup_questions(questions) -> list[str]:
    seen, out = set(), []
    for q in questions:
        q = (q or "").strip()
        k = norm_question(q)
        if k and k not in seen:
            seen.add(k)
            out.append(q)
    return out


def sentence_windows(sentences: list[str]) -> list[str]:
    """Each pair of consecutive sentences (no LLM): an answer spread over two sentences, or a pronoun
    whose referent sits in the sentence before, matches neither sentence alone (EVALUATION.md §4.7)."""
    return [f"{a} {b}" for a, b in zip(sentences, sentences[1:])]


def title_text(title: str | None) -> str:
    """A document title as words: wiki-style ids ("Super_Bowl_50") embed and match as "Super Bowl 50"."""
    return " ".join((title or "").replace("_", " ").split())


def vector_rows(chunk: dict, kinds: list[str], questions: list[str], sentences: list[str] | None = None,
                aux_questions: bool = False, atom: str | None = None, title: str | None = None,
                title_prefix: bool = False) -> list[dict]:
    """`atom`: the statement the questions were generated from (atom granularity). An `atomquote` vector
    embeds "question\natom": the question's wording plus only the fact it asks about, where `quote`
    adds the whole chunk and drowns a single question in it.

    `title` (the document's, given by the base rows only): with `title_prefix` the chunk vector embeds
    "title\ntext" (how BEIR and sentence-transformers embed titled passages), and the `title` kind is
    one more vector holding the title alone, so a query naming the document matches it even when the
    chunk's text never repeats its title (its text also joins the chunk's BM25 document)."""
    base = {"chunk_idx": int(chunk["chunk_idx"]), "shard": int(chunk["shard"])}
    text = chunk["text"]
    title = title_text(title)
    embed = f"{title}\n{text}" if title_prefix and title else text
    rows = [base | {"kind": "chunk", "text": text, "embed_text": embed, "qn": -1, "store": "chunk" in kinds}]
    if "title" in kinds and title:
        rows.append(base | {"kind": "title", "text": title, "embed_text": title, "qn": -1, "store": True})
    if "sentence" in kinds:
        rows += [base | {"kind": "sentence", "text": s, "embed_text": s, "qn": -1, "store": True}
                 for s in (sentences or [])]
    if "window" in kinds:
        rows += [base | {"kind": "window", "text": w, "embed_text": w, "qn": -1, "store": True}
                 for w in sentence_windows(sentences or [])]
    qs = dedup_questions(questions)
    if "question" in kinds or aux_questions:
        stored = "question" in kinds
        rows += [base | {"kind": "question", "text": q, "embed_text": q, "qn": i, "store": stored}
                 for i, q in enumerate(qs)]
    if "quote" in kinds:
        rows += [base | {"kind": "quote", "text": q, "embed_text": f"{q}\n{text}", "qn": i, "store": True}
                 for i, q in enumerate(qs)]
    if "atomquote" in kinds:
        ctx = atom or text
        rows += [base | {"kind": "atomquote", "text": q, "embed_text": f"{q}\n{ctx}", "qn": i, "store": True}
                 for i, q in enumerate(qs)]
    if "onedoc" in kinds and qs:
        rows.append(base | {"kind": "onedoc", "text": f"{text[:80]}… + {len(qs)} questions",
                            "embed_text": text + "\n" + "\n".join(qs), "qn": -1, "store": True})
    return rows
