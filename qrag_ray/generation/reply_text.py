"""A raw LLM reply -> its content lines: chat tokens, <think> blocks, code fences, role lines, JSON
wrapping, numbering, bullets, labels and quotes removed. Also the rules every parser applies to those
lines: whether the final one was cut off by max_tokens, which items are acceptable, and deduplication.
Pure functions, no model, no Ray; `qrag_ray.generation.parsing` builds the parsers on them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

MAX_CHARS = 500

_SPECIAL_TOKENS = re.compile(r"<\|[A-Za-z0-9_]+\|>|<\/?s>|<eos>|<bos>|<(?:start|end)_of_turn>|\[/?INST\]",
                             re.IGNORECASE)
_END_TOKENS = re.compile(r"<\|(?:im_end|endoftext|eot_id|end)\|>|<\/s>|<eos>|<end_of_turn>", re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
FENCE = re.compile(r"^\s*(?:```|~~~)[\w+.-]*\s*")
ROLE_LINE = re.compile(r"^\s*(?:assistant|user|system)\s*:?\s*$", re.IGNORECASE)

# One numbering/bullet/label prefix; applied repeatedly ("- **Q1:** " -> "").
_NUM_Q_LOOKAHEAD = (
    r"(?=(?:what|which|who|whom|whose|when|where|why|how|is|are|was|were|do|does|did|can|could|should|"
    r"would|will|has|have|had|in|on|at|for|according)\b)"
)
_PREFIX = re.compile(
    r"""^(?:
        \#{1,6}\s+                                   # markdown heading
      | >\s*                                         # blockquote
      | [-*+•·▪◦●○■►▶–—]\s+                          # bullets
      | [-•·–—]+(?=[A-Z"“'])                         # bullet glued to the text
      | \(?\d{1,3}\s*[.)\]:](?!\d)\s*                # 1.  1)  (1)  1:  1]
      | \d{1,3}\s*[-–—]\s+                           # 1 -
      | \[\d{1,3}\]\s*                               # [1]
      | \#\d{1,3}(?:[.):-]\s*|\s+(?=[A-Z]))            # #1
      | \(?[a-h]\)\s+                                # a)  (b)
      | (?:q|question|query|item)\s*\#?\d{1,3}\s*[.):\-–—]\s*   # Q1:  Question 1.  Q1)
      | (?:q|question|query|generated\ question|hypothetical\ question)\s*[:.\-–—]\s+   # Q:  Question:
      | (?:q|question)\s*:                           # Q:What
    )""" + "|^(?:q|question)\\s*\\d{1,3}\\s+" + _NUM_Q_LOOKAHEAD,   # Q1 What
    re.IGNORECASE | re.VERBOSE,
)
ANSWER_LABEL = re.compile(r"^\s*(?:\*\*)?(?:a|ans|answer)\s*\d{0,3}\s*(?:\*\*)?\s*[:.)\-–—]\s*", re.IGNORECASE)
ANSWER_LINE = re.compile(r"^\s*(?:\*\*)?(?:a|ans|answer)\s*\d{0,3}\s*(?:\*\*)?\s*:", re.IGNORECASE)

_PAIRS = {'"': '"', "'": "'", "“": "”", "‘": "’", "«": "»", "`": "`", "*": "*", "_": "_", "(": ")", "[": "]"}
_CLOSERS = set(_PAIRS.values()) | {"”", "’"}

# A sentence that announces the content rather than being it ("Sure! Here are 10 questions:").
PREAMBLE = re.compile(
    r"^(?:sure|certainly|okay|ok|of course|absolutely|great|alright|here(?:'s| is| are)|below (?:is|are)|"
    r"the following|i (?:have|will|'ll|can)|let me|these are|based on)\b", re.IGNORECASE)
_TERMINAL = re.compile(r"[.!?。！？…)\]\"'”’»*`]\s*$")
_REPEAT_WORD = re.compile(r"\b(\w+)(?:\W+\1\b){3,}", re.IGNORECASE)


def clean_text(raw: str | None) -> str:
    """Remove chat special tokens and <think> blocks; normalise newlines. Keeps everything else."""
    if not raw:
        return ""
    text = str(raw).replace("\r\n", "\n").replace("\r", "\n")
    text = _THINK.sub("", text)
    text = _SPECIAL_TOKENS.sub("\n", text)
    return text.replace("？", "?").replace("\u00a0", " ")


def normalize_key(text: str) -> str:
    """Dedup key: lower case, punctuation and whitespace runs collapsed."""
    return re.sub(r"[\W_]+", " ", text.lower()).strip()


def strip_wrappers(text: str) -> str:
    """`text` without the quotes, brackets or emphasis marks around it, and without an unbalanced one at either
    end."""
    text = text.strip()
    for _ in range(4):
        if not (len(text) >= 2 and text[0] in _PAIRS and text[-1] == _PAIRS[text[0]]):
            break
        text = text[1:-1].strip()
    # an unbalanced opener left at the start (its closer went with the text after "?")
    while text and text[0] in _PAIRS:
        opener = text[0]
        closer = _PAIRS[opener]
        if (text.count(opener) % 2 == 0) if opener == closer else (text.count(closer) >= text.count(opener)):
            break
        text = text[1:].lstrip()
    while text and text[-1] in _CLOSERS:
        closer = text[-1]
        if closer in ("'", '"', "`", "*", "_"):
            balanced = text.count(closer) % 2 == 0
        else:
            balanced = any(text.count(o) >= text.count(closer) for o, c in _PAIRS.items() if c == closer)
        if balanced:
            break
        text = text[:-1].rstrip()
    return text


def strip_prefixes(text: str, extra: re.Pattern | None = None) -> str:
    """`text` without its leading numbering, bullets and labels (and `extra`'s), however many are stacked."""
    for _ in range(8):
        before = text.strip()
        text = _PREFIX.sub("", before, count=1)
        if extra is not None:
            text = extra.sub("", text, count=1)
        text = strip_wrappers(text)
        if text == before:
            break
    return text.strip()


def _prepare_line(line: str) -> str:
    """Line-level cleanup shared by all parsers: fences, markdown bold, JSON-ish punctuation, prefixes."""
    line = FENCE.sub("", line).replace("**", "").strip()
    if line.startswith("__") or line.endswith("__"):
        line = line.strip("_").strip()
    # JSON-ish list items: ["What is X?", "What is Y?"] or  "What is X?",
    line = re.sub(r"^\[\s*(?=[\"'“])", "", line)
    line = re.sub(r"(?<=[\"'”])\s*\]?\s*,?\s*$", "", line)
    return strip_wrappers(strip_prefixes(line.strip().rstrip(",;").strip()))


def _json_items(text: str) -> list[str] | None:
    """If the reply holds JSON (a list of strings / objects, or {"questions": [...]}), its items as lines."""
    lines = [ln for ln in text.split("\n") if not FENCE.fullmatch(ln)]
    try:
        start = next(i for i, ln in enumerate(lines) if ln.lstrip()[:1] in ("[", "{"))
        end = next(j for j in range(len(lines) - 1, start - 1, -1) if lines[j].rstrip()[-1:] in ("]", "}"))
        data = json.loads("\n".join(lines[start:end + 1]).strip())
    except (StopIteration, ValueError, TypeError):  # no JSON in the reply
        return None
    if not isinstance(data, (list, dict)):
        return None
    out: list[str] = []

    def walk(node) -> None:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            lower = {str(k).lower(): v for k, v in node.items()}
            keys = ("question", "q", "query", "statement", "fact", "atom", "text")
            question = next((lower[k] for k in keys if k in lower), None)
            if isinstance(question, str):
                answer = next((lower[k] for k in ("answer", "a") if k in lower), None)
                out.append(f"{question.strip()} {answer.strip()}" if isinstance(answer, str) and answer.strip()
                           else question)
                return
            for key in ("questions", "atoms", "facts", "statements", "items", "pairs", "qa"):
                if key in lower:
                    walk(lower[key])
                    return
            for value in node.values():
                if isinstance(value, (list, dict)):
                    walk(value)

    walk(data)
    return [" ".join(s.split()) for s in out]


def reply_lines(raw: str | None) -> tuple[list[str], bool]:
    """Prepared, non-empty content lines and whether the reply ended normally (newline / end token / JSON)."""
    if not raw or not str(raw).strip():
        return [], True
    raw = str(raw)
    ended = bool(_END_TOKENS.search(raw[-40:])) or raw.endswith("\n")
    text = clean_text(raw)
    if (items := _json_items(text)) is not None:
        return [ln for ln in (_prepare_line(s) for s in items) if ln], True
    kept = [ln for ln in text.split("\n") if not (FENCE.match(ln) and not FENCE.sub("", ln).strip())
            and not ROLE_LINE.match(ln)]
    return [p for p in map(_prepare_line, kept) if p and re.search(r"\w", p)], ended


def looks_cut(last: str, others: Iterable[str], ended: bool, truncated: bool | None) -> bool:
    """Was the final line cut off by max_tokens?"""
    if truncated is False or ended or not last or _TERMINAL.search(last):
        return False
    if truncated:
        return True
    others = list(others)
    return bool(others) and 2 * sum(1 for o in others if _TERMINAL.search(o)) >= len(others)


def drop_cut_tail(lines: list[str], ended: bool, truncated: bool | None) -> None:
    """Drop the text after the final '?' of the reply when max_tokens cut it ("…? …? What is the Eif").
    It is neither an answer nor a question. The guess counts the '?'-segments of the final line as
    finished units beside the other lines, so a one-line loop is judged like a multi-line one."""
    marks = list(re.finditer(r"\?+", lines[-1]))
    if not marks:
        return
    cut = marks[-1].end()
    head = lines[-1][:cut]
    tail = lines[-1][cut:].strip()
    segments = [seg for seg in re.split(r"(?<=\?)\s+", head) if seg.strip()]
    if tail and looks_cut(tail, lines[:-1] + segments, ended, truncated):
        lines[-1] = head


def acceptable(item: str, min_words: int, max_words: int) -> bool:
    """Is `item` worth keeping: `min_words` to `max_words` words, at most MAX_CHARS characters, a letter in
    it, and no word repeated 4+ times in a row?"""
    return (min_words <= len(item.split()) <= max_words and len(item) <= MAX_CHARS
            and bool(re.search(r"[^\W\d_]", item)) and not _REPEAT_WORD.search(item))


class Dedup:
    """Remembers the items seen so far by `normalize_key`; `add` is True only for an item's first copy."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def add(self, item: str) -> bool:
        key = normalize_key(item)
        if not key or key in self.seen:
            return False
        self.seen.add(key)
        return True

