"""The query-time LLM parsers and the answer gate (pure; no Ray, no LLM server)."""

from __future__ import annotations

import asyncio

import pytest

from qrag_ray.generation.prompts import DONT_KNOW
from qrag_ray.search.page import SearchResult
from qrag_ray.serving.answer import Answerer, extract_citations, hyde_passage, parse_answer
from qrag_ray.serving.api_errors import ApiError


def test_hyde_passage_is_the_cleaned_reply_or_the_query():
    """The served mode=hyde and `qrag eval --hyde` both embed this."""
    raw = "<think>plan the answer</think>\nA for loop's else runs when the loop ends without break.<|im_end|>"
    assert hyde_passage(raw, "q?") == "A for loop's else runs when the loop ends without break."
    assert hyde_passage("", "when does else run?") == "when does else run?"
    assert hyde_passage(None, "q") == "q"
    assert hyde_passage("<think>only thinking</think>  ", "q") == "q"


@pytest.mark.parametrize("raw,want", [
    ("I don't know.", DONT_KNOW),
    ("  i do not know the answer from these passages", DONT_KNOW),
    ("", DONT_KNOW),
    (None, DONT_KNOW),
    ("```\nassistant:\nAnswer: The else clause runs when the loop ends without break [1].\n```",
     "The else clause runs when the loop ends without break [1]."),
    ("<think>hmm</think>It runs after the loop [2].<|im_end|>", "It runs after the loop [2]."),
])
def test_parse_answer(raw, want):
    assert parse_answer(raw) == want


def test_a_long_answer_that_opens_with_i_dont_know_is_kept():
    text = "I don't know the exact year, but the passages say the with statement calls __exit__ on leaving [1]."
    assert parse_answer(text) == text


def test_extract_citations_in_first_seen_order():
    assert extract_citations("A [2], B [1, 3]; C [2;4] and [x] [12]") == [2, 1, 3, 4, 12]
    assert extract_citations("") == []


class _FakeSynth:
    def __init__(self, reply: str):
        self.reply = reply
        self.calls = []
        self.complete = self

    async def remote(self, messages, max_tokens):
        self.calls.append(messages)
        return self.reply


RESULTS = [SearchResult(chunk_id="a#0", doc_id="a", text="alpha", score=0.9, cosine=0.6),
           SearchResult(chunk_id="b#0", doc_id="b", text="beta", score=0.8, cosine=0.5),
           SearchResult(chunk_id="c#0", doc_id="c", text="gamma", score=0.7, cosine=0.1)]


def test_answer_cites_only_the_supported_prefix():
    synth = _FakeSynth("From [1] and [2], also [3].")
    text, citations = asyncio.run(Answerer(synth, 64, 0.35).answer("q?", RESULTS, 128, {}))
    assert text == "From [1] and [2], also [3]."
    assert [(c.n, c.chunk_id) for c in citations] == [(1, "a#0"), (2, "b#0")]  # [3] was below the gate: not sent
    assert "gamma" not in str(synth.calls[0]) and "alpha" in str(synth.calls[0])


def test_answer_gate_says_i_dont_know_without_the_llm():
    synth = _FakeSynth("never asked")
    assert asyncio.run(Answerer(synth, 64, 0.95).answer("q?", RESULTS, 128, {})) == (DONT_KNOW, [])
    assert synth.calls == []


def test_without_an_llm_the_features_are_501():
    with pytest.raises(ApiError) as raised:
        Answerer(None, 64, 0.35).require("/v1/answer")
    assert raised.value.status == 501 and raised.value.kind == "llm_not_configured"
    assert "Retry-After" not in raised.value.headers
