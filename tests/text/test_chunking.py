"""Chunkers on real text (the Python language reference): token windows with overlap, paragraphs,
sentence groups, none — and their edge cases."""

from __future__ import annotations

import itertools
import re

import pytest

from qrag_ray.config.index import ChunkerConfig
from qrag_ray.text.chunking import chunk_document, chunk_text, paragraphs, sentence_groups, token_windows
from qrag_ray.text.sentences import split_sentences


@pytest.fixture(scope="module")
def text(corpus_records):
    return next(r["text"] for r in corpus_records() if r["id"] == "for")


def toks(text: str) -> list[str]:
    return text.split()


def test_token_windows_size_and_overlap(text):
    words = toks(text)
    assert len(words) > 250
    size = 100
    overlap = 20
    wins = token_windows(text, size, overlap)
    assert all(len(toks(w)) <= size for w in wins)
    assert all(len(toks(w)) == size for w in wins[:-1])
    # consecutive windows share exactly `overlap` tokens: the tail of one is the head of the next
    for window, following in itertools.pairwise(wins):
        assert toks(window)[-overlap:] == toks(following)[:overlap]
    # together they cover the document's tokens in order, nothing lost or invented
    rebuilt = toks(wins[0]) + [t for w in wins[1:] for t in toks(w)[overlap:]]
    assert rebuilt == words
    # each window is a verbatim substring of the document (citations point at real text)
    assert all(w in text for w in wins)
    step = size - overlap
    assert len(wins) == max(1, -(-(len(words) - overlap) // step))


def test_token_window_default_is_hype_500_50():
    cfg = ChunkerConfig()
    assert (cfg.method, cfg.size, cfg.overlap) == ("token", 500, 50)


def test_token_window_shorter_than_size(text):
    short = " ".join(toks(text)[:30])
    assert token_windows(short, 100, 20) == [short]
    # exactly one window's worth: no second window made only of overlap
    exact = " ".join(toks(text)[:100])
    assert token_windows(exact, 100, 20) == [exact]


@pytest.mark.parametrize("empty", ["", "   ", "\n\n\t"])
@pytest.mark.parametrize("method", ["token", "paragraph", "sentence", "none"])
def test_empty_text_gives_no_chunks(empty, method):
    assert chunk_text(empty, ChunkerConfig(method=method, size=50, overlap=5)) == []


def test_overlap_must_be_smaller_than_size():
    with pytest.raises(ValueError, match="overlap"):
        ChunkerConfig(method="token", size=50, overlap=50)
    with pytest.raises(ValueError, match="overlap"):
        token_windows("a b c", 2, 2)


def test_paragraphs_follow_blank_lines(text):
    paras = paragraphs(text)
    expected = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    assert paras == expected and len(paras) > 3


def test_long_paragraph_is_windowed(text):
    longest = max(paragraphs(text), key=lambda p: len(toks(p)))
    count = len(toks(longest))
    assert count > 40
    out = paragraphs(longest, max_tokens=20, overlap=5)
    assert len(out) > 1 and all(len(toks(p)) <= 20 for p in out)
    assert toks(out[0])[-5:] == toks(out[1])[:5]


def test_sentence_groups(text):
    sents = split_sentences(text)
    groups = sentence_groups(text, 3)
    assert len(groups) == -(-len(sents) // 3)
    assert groups[0] == " ".join(sents[:3])
    assert " ".join(groups) == " ".join(sents)


def test_none_keeps_document_whole(text):
    assert chunk_text(text, ChunkerConfig(method="none")) == [text.strip()]


def test_chunk_document_ids_and_fields(text):
    doc = {"doc_id": "for", "title": "The for statement", "text": text}
    rows = list(chunk_document(doc, ChunkerConfig(method="token", size=80, overlap=10)))
    assert len(rows) > 1
    assert [r["chunk_id"] for r in rows] == [f"for#{i}" for i in range(len(rows))]
    assert all(r["doc_id"] == "for" and r["title"] == "The for statement" for r in rows)
    assert list(chunk_document({"doc_id": "e", "text": ""}, ChunkerConfig())) == []
