"""The query-time LLM: HyDE passages, answers with [n] citations, and the gate that says "I don't know"
without asking it. `Synthesizer` is the LLM's deployment; `Answerer` is the Router's side of it; the
parsers are pure (`qrag eval --hyde` embeds `hyde_passage` too, so what it scores is what is served).
"""

from __future__ import annotations

import logging
import re

from qrag_ray.errors import find_user_error
from qrag_ray.generation.parsing import strip_reply_format
from qrag_ray.generation.prompts import DONT_KNOW, get_prompt
from qrag_ray.generation.reply_text import clean_text
from qrag_ray.search.page import SearchResult
from qrag_ray.serving import api_models as m
from qrag_ray.serving.api_errors import ApiError

logger = logging.getLogger("ray.serve")

_DONT_KNOW_RE = re.compile(r"^\W*i\s+(?:do\s+not|don[’']?t)\s+know\b", re.IGNORECASE)
_CITATION = re.compile(r"\[(\d{1,3}(?:\s*[,;]\s*\d{1,3})*)\]")


def parse_answer(raw: str | None) -> str:
    """The synthesizer's answer, cleaned; any short 'I don't know' variant becomes exactly DONT_KNOW."""
    text = strip_reply_format(raw)
    if not text or (_DONT_KNOW_RE.match(text) and len(text.split()) <= 12):
        return DONT_KNOW
    return text


def extract_citations(answer: str) -> list[int]:
    """Passage numbers cited as [1], [2], [1, 3] in an answer, in first-seen order."""
    nums = [int(n) for found in _CITATION.finditer(answer or "") for n in re.split(r"\s*[,;]\s*", found.group(1))]
    return list(dict.fromkeys(nums))


def hyde_passage(raw: str | None, query: str) -> str:
    """The text HyDE embeds: the LLM's cleaned passage, or the query itself when the reply is empty."""
    return clean_text(raw).strip() or query


class Synthesizer:
    """The LLM deployment (qrag_ray.generation.chat behind it)."""

    def __init__(self, generator: dict):
        from qrag_ray.generation.chat import get_chat_model

        self.model = get_chat_model(generator)
        if hasattr(self.model, "start"):  # vLLM: pay the engine start-up before traffic
            self.model.start()

    async def complete(self, messages: list[dict], max_tokens: int) -> str:
        return await self.model.acomplete(messages, max_tokens=max_tokens, temperature=0.0)


class Answerer:
    """The Router's LLM calls; `synth` is the Synthesizer's handle, or None when none is configured."""

    def __init__(self, synth, hyde_max_tokens: int, min_cosine: float):
        self.synth, self.hyde_max_tokens, self.min_cosine = synth, hyde_max_tokens, min_cosine

    def require(self, what: str) -> None:
        if self.synth is None:  # 501: a feature this server lacks, not an outage (clients retry a 503)
            raise ApiError(501, "llm_not_configured", f"{what} needs an LLM, and this server has none configured: "
                           "start it with a generator (qrag serve --llm-url URL, or args.generator in the serve "
                           "config)")

    async def _complete(self, messages: list[dict], max_tokens: int, what: str) -> str:
        self.require(what)
        try:
            return await self.synth.complete.remote(messages, max_tokens)
        except Exception as error:
            logger.warning("LLM call failed: %s", error)
            user_error = find_user_error(error)
            raise ApiError(502, "llm_failed", f"the LLM backend failed: {user_error or type(error).__name__}") from None

    async def query_text(self, req: m._Request, stage: dict) -> tuple[str, str | None]:
        """(the text to embed, the HyDE passage): the query, or in HyDE mode an LLM-written passage."""
        if req.mode != "hyde":
            return req.query, None
        stage["stage"] = "writing the HyDE passage (LLM)"
        raw = await self._complete(get_prompt("hyde").render(req.query), self.hyde_max_tokens, "mode=hyde")
        passage = hyde_passage(raw, req.query)
        return passage, passage

    async def answer(self, query: str, results: list[SearchResult], max_tokens: int, stage: dict) -> tuple[str, list]:
        """(the answer, its citations) from the results that support one. The gate is on raw similarity,
        not the fused score (rrf/sum/hybrid scores live on other scales); results are best first, so
        the supported ones are a prefix and [n] numbers both lists alike."""
        support = [x for x in results if (x.score if x.cosine is None else x.cosine) >= self.min_cosine]
        if not support:
            return DONT_KNOW, []
        stage["stage"] = "writing the answer (LLM)"
        msgs = get_prompt("answer").render(query, context=[x.text for x in support])
        text = parse_answer(await self._complete(msgs, max_tokens, "/v1/answer"))
        if text == DONT_KNOW:
            return text, []
        return text, [m.Citation(n=n, chunk_id=support[n - 1].chunk_id, doc_id=support[n - 1].doc_id)
                      for n in extract_citations(text) if 1 <= n <= len(support)]
