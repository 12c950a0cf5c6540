"""LLM output -> questions, (question, answer) pairs, atomic statements. Pure functions, no model, no Ray.

Small models' replies are messy (numbering despite "no prefix", preambles, loops cut off by max_tokens):
the parsers undo the formatting and keep the content (`reply_text` strips it, `line_split` splits a
QuOTE "Question? Answer" line and several questions on one line) and drop preambles, closing offers,
non-questions, duplicates, degenerate items and a last line cut off by max_tokens. Parsing is not
filtering: a well-formed question is kept however silly; semantic filters live in qrag_ray.index.question_filters.
"""

from __future__ import annotations

import re

from qrag_ray.generation.line_split import clean_answer, clean_question, is_interrogative, split_line
from qrag_ray.generation.reply_text import (
    ANSWER_LABEL,
    ANSWER_LINE,
    FENCE,
    PREAMBLE,
    ROLE_LINE,
    Dedup,
    acceptable,
    clean_text,
    drop_cut_tail,
    looks_cut,
    normalize_key,
    reply_lines,
    strip_prefixes,
    strip_wrappers,
)
from qrag_ray.text import sentences

__all__ = ["clean_text", "is_interrogative", "normalize_key", "parse_atoms", "parse_output", "parse_qa",
           "parse_questions", "strip_reply_format"]

MIN_WORDS = 3
MAX_QUESTION_WORDS = 60
MAX_ATOM_WORDS = 80

_ATOM_PREFIX = re.compile(r"^(?:(?:atomic\s+)?(?:fact|atom|statement|claim)\s*\#?\d{0,3}\s*[:.)\-–—]\s*)",
                          re.IGNORECASE)
# Chat around the task rather than content: greetings, offers, sign-offs.
_META = re.compile(
    r"^(?:would you like|do you (?:want|need)|shall i|should i (?:generate|write|create|continue|provide)|"
    r"can i help|is there anything|let me know|i hope|hope this|feel free|need more|want more)\b"
    r"|\b(?:more|additional|other|further) questions\b", re.IGNORECASE)


def _qa_pairs(raw: str | None, *, require_qmark: bool, truncated: bool | None, min_words: int,
              max_words: int) -> list[tuple[str, str]]:
    lines, ended = reply_lines(raw)
    if not lines:
        return []
    drop_cut_tail(lines, ended, truncated)
    last_cut = looks_cut(lines[-1], lines[:-1], ended, truncated)
    out: list[list[str]] = []
    dedup = Dedup()
    last_answer: list[str] | None = None  # the pair whose answer came from the final line
    for i, line in enumerate(lines):
        is_last = i == len(lines) - 1
        if ANSWER_LINE.match(line):
            # two-line format "Q: …?" / "A: …": the answer belongs to the previous question
            if out and not out[-1][1]:
                out[-1][1] = clean_answer(line)
                if is_last:
                    last_answer = out[-1]
            continue
        pairs, rest = split_line(line)
        if not require_qmark and not (last_cut and is_last):
            tail = pairs[-1][1] if pairs else rest
            question = clean_question(tail) if tail else ""
            if question and is_interrogative(question) and not question.endswith(":"):
                if pairs:
                    pairs[-1][1] = ""
                pairs.append([re.sub(r"[\s.!;:,]+$", "", question) + "?", ""])
        for raw_question, raw_answer in pairs:
            question = clean_question(raw_question)
            answer = clean_answer(raw_answer)
            if not acceptable(question, min_words, max_words) or _META.search(question):
                continue
            if dedup.add(question):
                out.append([question, answer])
                if is_last:
                    last_answer = out[-1]
            elif answer:  # a repeated question may bring the answer its first copy lacked
                key = normalize_key(question)
                if lacking := next((p for p in out if not p[1] and normalize_key(p[0]) == key), None):
                    lacking[1] = answer
    if last_answer is not None and last_answer[1] and not ended and truncated is not False:
        # an answer cut off by max_tokens: drop it (the question itself was complete). Unless the caller
        # says so, guess from the other answers: cut if most of them end with punctuation and this not.
        others = [p[1] for p in out if p is not last_answer and p[1]]
        if looks_cut(last_answer[1], others, ended, truncated):
            last_answer[1] = ""
    return [(q, a) for q, a in out]


def parse_questions(raw: str | None, *, max_questions: int | None = None, require_qmark: bool = True,
                    truncated: bool | None = None, min_words: int = MIN_WORDS,
                    max_words: int = MAX_QUESTION_WORDS) -> list[str]:
    """Questions in `raw`, cleaned, deduplicated, in order; [] for an empty or None reply.

    `require_qmark=False` also keeps lines that open like a question (wh-word or auxiliary verb) and adds
    the "?". `truncated`: True when the caller knows the reply hit max_tokens (finish_reason "length"),
    False when it knows it did not, None to guess (the last line lacks end punctuation while most other
    lines have it, and the reply does not end with a newline or an end token). A cut last line never
    yields a question unless its "?" was reached. `max_questions` keeps the first N after dedup.
    """
    pairs = _qa_pairs(raw, require_qmark=require_qmark, truncated=truncated, min_words=min_words, max_words=max_words)
    return [q for q, _ in pairs][:max_questions]


def parse_qa(raw: str | None, *, max_pairs: int | None = None, truncated: bool | None = None,
             min_words: int = MIN_WORDS, max_words: int = MAX_QUESTION_WORDS) -> list[tuple[str, str]]:
    """QuOTE 'Question? Answer' pairs (also 'Q: …?' / 'A: …' on two lines). The answer is '' when missing
    or cut off by max_tokens. Questions equal `parse_questions(raw)`."""
    return _qa_pairs(raw, require_qmark=True, truncated=truncated, min_words=min_words, max_words=max_words)[:max_pairs]


def parse_atoms(raw: str | None, *, max_atoms: int | None = None, truncated: bool | None = None,
                min_words: int = MIN_WORDS, max_words: int = MAX_ATOM_WORDS, split_sentences: bool = True) -> list[str]:
    """Atomic statements, one per line: numbering/bullets/"Fact 1:" labels stripped, preambles and sign-offs
    dropped, a line holding several sentences split into them, duplicates removed, a cut last line dropped."""
    lines, ended = reply_lines(raw)
    lines = [ln for ln in (strip_prefixes(ln, _ATOM_PREFIX) for ln in lines) if ln]
    if not lines:
        return []
    if looks_cut(lines[-1], lines[:-1], ended, truncated):
        lines = lines[:-1]
    out: list[str] = []
    dedup = Dedup()
    for line in lines:
        if line.rstrip().endswith(":") or _META.search(line):
            continue
        for piece in sentences.split_sentences(line) if split_sentences else [line]:
            piece = strip_wrappers(re.sub(r"\s+", " ", piece)).strip()
            announces = PREAMBLE.match(piece) and ("fact" in piece.lower() or "statement" in piece.lower())
            if announces or piece.endswith(":") or not acceptable(piece, min_words, max_words):
                continue
            if dedup.add(piece):
                out.append(piece)
    return out[:max_atoms]


def strip_reply_format(raw: str | None) -> str:
    """A free-text reply (an answer, a passage) without chat tokens, <think> blocks, code-fence and role
    lines, or a leading "Answer:" label."""
    text = clean_text(raw)
    text = "\n".join(ln for ln in text.split("\n") if not FENCE.fullmatch(ln.strip()) and not ROLE_LINE.match(ln))
    return ANSWER_LABEL.sub("", text.strip(), count=1).strip() if ANSWER_LINE.match(text.strip()) else text.strip()


def parse_output(raw: str | None, output_kind: str, max_items: int | None = None, **kwargs) -> list[str]:
    """Dispatch on a template's `output`: 'questions' and 'qa' give questions (the embedded text; answers via
    `parse_qa`), 'atoms' gives statements, 'text' gives [the cleaned reply] (or [] when empty)."""
    if output_kind == "questions":
        return parse_questions(raw, max_questions=max_items, **kwargs)
    if output_kind == "qa":
        return [q for q, _ in parse_qa(raw, max_pairs=max_items, **kwargs)]
    if output_kind == "atoms":
        return parse_atoms(raw, max_atoms=max_items, **kwargs)
    if output_kind == "text":
        text = clean_text(raw).strip()
        return [text] if text else []
    raise ValueError(f"unknown output kind '{output_kind}' (known: questions, qa, atoms, text)")
