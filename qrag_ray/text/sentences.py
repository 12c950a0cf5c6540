"""The one sentence splitter, for corpus text (structured atoms, the sentence chunker) and LLM replies
alike: split on end punctuation and whitespace (what a user would do without a tagger, and what the
reference figures used) but not after common abbreviations or single-letter initials ("U.S.", "Dr.",
"J. Smith"), which would leave fragments that embed badly."""

from __future__ import annotations

import re

_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "inc", "ltd", "co",
    "corp", "no", "vol", "fig", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct",
    "nov", "dec", "u.s", "u.k", "a.m", "p.m", "approx", "gen", "gov", "rev", "mt", "ft",
}
_BOUNDARY = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+")


def keeps_its_dot(text: str) -> bool:
    """Does `text`, ending with a full stop, end with an abbreviation or an initial (so the stop does not
    end a sentence)? The word is the last whitespace-delimited one, without its dots and opening quotes."""
    word = (text.rsplit(None, 1) or [""])[-1].rstrip(".").lower().lstrip("(\"'“‘")
    return text.endswith(".") and (word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()))


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, stripped, in order; empty input gives []."""
    text = (text or "").strip()
    out: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        if keeps_its_dot(text[start:match.start()].rstrip()):
            continue
        out.append(text[start:match.end()].strip())  # never empty: it holds the boundary's end punctuation
        start = match.end()
    return out + [tail] if (tail := text[start:].strip()) else out
