"""One prepared reply line -> the questions on it with their answers: where a question starts (a
sentence start, not after an abbreviation or an initial: text/sentences.py's rule) and where the text
before a question is the previous question's answer. Pure functions, no model, no Ray.
"""

from __future__ import annotations

import re

from qrag_ray.generation.reply_text import ANSWER_LABEL, PREAMBLE, strip_prefixes, strip_wrappers
from qrag_ray.text.sentences import keeps_its_dot

_WH = r"(?:what|which|who|whom|whose|when|where|why|how)"
_AUX = (
    r"(?:is|are|was|were|am|do|does|did|can|could|should|would|will|shall|has|have|had|may|might|must|"
    r"isn't|aren't|wasn't|weren't|don't|doesn't|didn't|can't|couldn't|shouldn't|wouldn't|won't|hasn't|"
    r"haven't|hadn't)"
)
_INTERROGATIVE = re.compile(
    rf"^(?:{_WH}\b|{_AUX}\s|(?:in|on|at|for|from|to|by|with|under|during|after|before|of|between|among|"
    rf"within|since|until|through|about|according\s+to\s+[^,?]{{1,60}},)\s+{_WH}\b)",
    re.IGNORECASE,
)
_INTERROGATIVE_INNER = re.compile(r"(?<=\s)(?:What|Which|Who|Whom|Whose|When|Where|Why|How)\b")


def is_interrogative(text: str) -> bool:
    """Does `text` open like a question (wh-word, auxiliary verb, or preposition + wh-word)?"""
    return bool(_INTERROGATIVE.match(text.strip().lstrip("¿\"'“‘*_(")))


def _boundaries(seg: str) -> list[int]:
    """Start offsets of sentences inside `seg`: after '. ', '! ', ': ', '; ' followed by a non-lowercase
    char, but not after the full stop of an abbreviation or an initial."""
    return [m.end() for m in re.finditer(r"[.!;:]+(\s+)(?=[^a-z\s])", seg)
            if seg[m.start()] in "!;:" or not keeps_its_dot(seg[:m.start() + 1])]


def clean_question(text: str) -> str:
    """A question without prefixes or wrappers, its whitespace collapsed and one "?" at the end."""
    text = re.sub(r"\s+", " ", strip_wrappers(strip_prefixes(text))).strip()
    return re.sub(r"\?+", "?", re.sub(r"\s+\?", "?", text)).lstrip("¿").strip()


def _is_label(text: str) -> bool:
    """Is `text` nothing but numbering / a 'Question:' label (so it belongs to the question after it)?"""
    stripped = text.strip()
    return bool(stripped) and not strip_prefixes(stripped).strip(" .:-–—)(")


def _cut_question(seg: str, first: bool) -> tuple[str, str]:
    """Split a '?'-terminated segment into (text before the question, the question)."""
    seg = seg.strip()
    bounds = _boundaries(seg)
    interrogative = [p for p in bounds if is_interrogative(strip_prefixes(seg[p:]))]
    if is_interrogative(strip_prefixes(seg)):
        interrogative = [b for b in interrogative if not _is_label(seg[:b])] or [0]
        # "What is X: Is it Y?" stays whole when it opens like a question and nothing before looks like
        # an answer or a preamble; only a later interrogative sentence start after '.', '!' moves the cut.
        interrogative = [b for b in interrogative if b == 0 or seg[:b].rstrip()[-1:] in ".!;"] or [0]
    if interrogative:
        cut = interrogative[-1]
    elif first:  # "Sure! Berlin has how many inhabitants?" -> cut after the last preamble-looking sentence
        cut = max((b for b in bounds if PREAMBLE.match(strip_prefixes(seg[:b])) or seg[:b].rstrip().endswith(":")),
                  default=0)
    elif bounds:
        cut = bounds[-1]
    else:
        # "Elon Musk When was Tesla founded?" (an answer without a full stop, then the next question)
        match = _INTERROGATIVE_INNER.search(seg)
        cut = match.start() if match else 0
    # numbering or a label just before the cut belongs to the question ("Paris. 2. What …?")
    earlier = [0] + [b for b in bounds if b < cut]
    for bound in reversed(earlier):
        if not (cut and _is_label(seg[bound:cut])):
            break
        cut = bound
    return seg[:cut].strip(), seg[cut:].strip()


def clean_answer(answer: str) -> str:
    """An answer without an "Answer:" label, a dangling "Question:" label at its end, quotes or extra spaces."""
    answer = ANSWER_LABEL.sub("", answer.strip()).strip()
    answer = re.sub(r"(?:^|\s)(?:q|question|query)\s*\d{0,3}\s*:?\s*$", "", answer, flags=re.IGNORECASE).strip()
    return re.sub(r"\s+", " ", answer.strip(" ,;\"'“”"))


def split_line(line: str) -> tuple[list[list[str]], str]:
    """[[question, answer], ...] found on one prepared line, plus the text before the first question."""
    pairs: list[list[str]] = []
    lead = ""
    start = 0
    for match in re.finditer(r"\?+", line):
        before, question = _cut_question(line[start:match.end()], first=not pairs)
        if pairs:
            pairs[-1][1] = (pairs[-1][1] + " " + before).strip()
        else:
            lead = before
        pairs.append([question, ""])
        start = match.end()
    tail = line[start:].strip()
    if pairs:
        pairs[-1][1] = tail
        return pairs, lead
    return pairs, tail
