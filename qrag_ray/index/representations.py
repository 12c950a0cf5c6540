"""Chunk + its questions/atoms -> the rows to embed (pure). Every chunk gets a `chunk` row: stored when
the representation includes chunks, else an auxiliary vector (store=False) for the question-chunk filters
and as the fallback of a chunk whose questions were all filtered out. `qn` links a quote vector to its
question so filters decided on the question apply to both."""

from __future__ import annotations

import itertools
import re

_NORM = re.compile(r"[^a-z0-9]+")


def norm_question(question: str) -> str:
    return _NORM.sub(" ", question.lower()).strip()


def dedup_questions(questions) -> list[str]:
    """The questions, stripped, without empty ones and repeats (compared lowercased, punctuation aside)."""
    kept: dict[str, str] = {}
    for question in ((q or "").strip() for q in questions):
        kept.setdefault(norm_question(question), question)
    return [q for k, q in kept.items() if k]


def sentence_windows(sentences: list[str]) -> list[str]:
    """Each pair of consecutive sentences (no LLM): an answer spread over two sentences, or a pronoun
    whose referent sits in the sentence before, matches neither sentence alone."""
    return [f"{first} {second}" for first, second in itertools.pairwise(sentences)]


def title_text(title: str | None) -> str:
    """A document title as words: wiki-style ids ("Super_Bowl_50") embed and match as "Super Bowl 50"."""
    return " ".join((title or "").replace("_", " ").split())


def vector_rows(chunk: dict, kinds: list[str], questions: list[str], sentences: list[str] | None = None,
                aux_questions: bool = False, atom: str | None = None, title: str | None = None,
                title_prefix: bool = False) -> list[dict]:
    """`atom`: the statement the questions were generated from; an `atomquote` vector embeds "question\natom",
    the question plus only the fact it asks about, where `quote` drowns it in the whole chunk. `title` (the
    document's): with `title_prefix` the chunk vector embeds "title\ntext" (as BEIR does), and the `title`
    kind is a vector of the title alone, so a query naming the document matches a chunk that never repeats it."""
    base = {"chunk_idx": int(chunk["chunk_idx"]), "shard": int(chunk["shard"])}

    def row(kind: str, text: str, embed: str | None = None, qn: int = -1, store: bool = True) -> dict:
        return base | {"kind": kind, "text": text, "embed_text": text if embed is None else embed, "qn": qn,
                       "store": store}

    text = chunk["text"]
    title = title_text(title)
    unique_questions = dedup_questions(questions)
    rows = [row("chunk", text, f"{title}\n{text}" if title_prefix and title else text, store="chunk" in kinds)]
    if "title" in kinds and title:
        rows.append(row("title", title))
    if "sentence" in kinds:
        rows += [row("sentence", s) for s in sentences or []]
    if "window" in kinds:
        rows += [row("window", w) for w in sentence_windows(sentences or [])]
    if "question" in kinds or aux_questions:
        rows += [row("question", q, qn=i, store="question" in kinds) for i, q in enumerate(unique_questions)]
    if "quote" in kinds:
        rows += [row("quote", q, f"{q}\n{text}", i) for i, q in enumerate(unique_questions)]
    if "atomquote" in kinds:
        rows += [row("atomquote", q, f"{q}\n{atom or text}", i) for i, q in enumerate(unique_questions)]
    if "onedoc" in kinds and unique_questions:
        rows.append(row("onedoc", f"{text[:80]}… + {len(unique_questions)} questions",
                        text + "\n" + "\n".join(unique_questions)))
    return rows
