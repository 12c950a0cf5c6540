"""The sentence splitter behind atom-sentence and the sentence chunker."""

from __future__ import annotations

import pytest

from qrag_ray.text.sentences import split_sentences


def test_splits_on_end_punctuation():
    assert split_sentences("One two. Three four! Five six? Seven") == [
        "One two.", "Three four!", "Five six?", "Seven"]


@pytest.mark.parametrize("text", ["", "   ", None])
def test_empty(text):
    assert split_sentences(text) == []


def test_keeps_abbreviations_and_initials_together():
    text = "Dr. Smith moved to the U.S. in 1990. J. R. R. Tolkien wrote books, e.g. The Hobbit. It sold well."
    assert split_sentences(text) == [
        "Dr. Smith moved to the U.S. in 1990.",
        "J. R. R. Tolkien wrote books, e.g. The Hobbit.",
        "It sold well.",
    ]


def test_closing_quotes_and_brackets_stay_with_their_sentence():
    text = 'He said "stop." Then he left (quickly.) The end.'
    assert split_sentences(text) == ['He said "stop."', "Then he left (quickly.)", "The end."]


def test_no_split_inside_numbers_or_dotted_names():
    text = "Use os.path.join to build paths. Version 3.11 added it."
    assert split_sentences(text) == ["Use os.path.join to build paths.", "Version 3.11 added it."]


def test_real_text_roundtrip(corpus_records):
    text = next(r["text"] for r in corpus_records() if r["id"] == "with")
    sents = split_sentences(text)
    assert len(sents) > 10
    # nothing lost: the sentences are the text's words in order
    assert " ".join(sents).split() == text.split()
    assert all(s == s.strip() and s for s in sents)
