"""LLM output -> questions, (question, answer) pairs, atomic statements. Pure functions, no model, no Ray.

Real replies are messy, small models most of all (measured with the bundled Qwen2.5-Coder-0.5B: it numbers its lines despite
"no prefix", adds preambles, and without a repetition penalty loops until max_tokens and is cut mid-line).
These parsers undo the formatting and keep the content:

- numbering and bullets: "1." "1)" "(1)" "[1]" "#1" "Q1:" "Question 1:" "- " "* " "•" "**1.**" "### 1.",
  labels ("Q:", "Question:", "Query:"), markdown bold, code fences, surrounding quotes, JSON arrays, chat
  special tokens (<|im_end|>) and <think> blocks;
- QuOTE "Question? Answer" lines: the question is kept up to and including its "?", the rest is its
  answer (`parse_qa` returns both); several questions on one line are split;
- preambles ("Sure! Here are 10 questions:"), closing offers ("Would you like more questions?"), blank
  lines, non-questions, duplicates (case, whitespace and punctuation-insensitive; first kept), too short
  (< 3 words) and absurdly long or degenerate (a word repeated 4+ times in a row) items are dropped;
- a final line cut off by max_tokens is dropped (see `truncated`).

Parsing is not filtering: a well-formed question is kept however silly ("What is the capital of Berlin?");
semantic filters live in qrag_ray.filters.

Size: one module over 400 lines on purpose: the cleaners share private regexes and boundary rules, and
splitting them apart would export those internals only to re-import them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = [
    "clean_text",
    "is_interrogative",
    "normalize_key",
    "parse_atoms",
    "parse_output",
    "parse_qa",
    "parse_questions",
    "strip_reply_format",
]

MIN_WORDS = 3
MAX_QUESTION_WORDS = 60
MAX_ATOM_WORDS = 80
MAX_CHARS = 500

# ---- low-level text cleanup --------------------------------------------------------------------------

_SPECIAL_TOKENS = re.compile(
    r"<\|[A-Za-z0-9_]+\|>|<\/?s>|<eos>|<bos>|<(?:start|end)_of_turn>|\[/?INST\]", re.IGNORECASE
)
_END_TOKENS = re.compile(r"<\|(?:im_end|endoftext|eot_id|end)\|>|<\/s>|<eos>|<end_of_turn>", re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^\s*(?:```|~~~)[\w+.-]*\s*")
_ROLE_LINE = re.compile(r"^\s*(?:assistant|user|system)\s*:?\s*$", re.IGNORECASE)

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
_ATOM_PREFIX = re.compile(
    r"^(?:(?:atomic\s+)?(?:fact|atom|statement|claim)\s*\#?\d{0,3}\s*[:.)\-–—]\s*)", re.IGNORECASE
)
_ANSWER_LABEL = re.compile(r"^\s*(?:\*\*)?(?:a|ans|answer)\s*\d{0,3}\s*(?:\*\*)?\s*[:.)\-–—]\s*", re.IGNORECASE)
_ANSWER_LINE = re.compile(r"^\s*(?:\*\*)?(?:a|ans|answer)\s*\d{0,3}\s*(?:\*\*)?\s*:", re.IGNORECASE)

_PAIRS = {'"': '"', "'": "'", "“": "”", "‘": "’", "«": "»", "`": "`", "*": "*", "_": "_", "(": ")", "[": "]"}
_CLOSERS = set(_PAIRS.values()) | {"”", "’"}

_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "eg", "ie", "inc", "ltd",
    "co", "corp", "no", "vol", "fig", "approx", "gen", "gov", "rev", "mt", "ft", "u.s", "u.k", "a.m", "p.m",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "op", "cf", "al",
}

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
_INTERROGATIVE_INNER = re.compile(rf"(?<=\s)(?:What|Which|Who|Whom|Whose|When|Where|Why|How)\b")

# Chat around the task rather than content: greetings, offers, sign-offs.
_META = re.compile(
    r"^(?:would you like|do you (?:want|need)|shall i|should i (?:generate|write|create|continue|provide)|"
    r"can i help|is there anything|let me know|i hope|hope this|feel free|need more|want more)\b"
    r"|\b(?:more|additional|other|further) questions\b",
    re.IGNORECASE,
)
_PREAMBLE = re.compile(
    r"^(?:sure|certainly|okay|ok|of course|absolutely|great|alright|here(?:'s| is| are)|below (?:is|are)|"
    r"the following|i (?:have|will|'ll|can)|let me|these are|based on)\b",
    re.IGNORECASE,
)
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


def is_interrogative(text: str) -> bool:
    """Does `text` open like a question (wh-word, auxiliary verb, or preposition + wh-word)?"""
    return bool(_INTERROGATIVE.match(text.strip().lstrip("¿\"'“‘*_(")))


def _strip_wrappers(s: str) -> str:
    s = s.strip()
    for _ in range(4):
        if len(s) >= 2 and s[0] in _PAIRS and s[-1] == _PAIRS[s[0]]:
            s = s[1:-1].strip()
            continue
        break
    # an unbalanced opener left at the start (its closer went with the text after "?")
    while s and s[0] in _PAIRS:
        opener, closer = s[0], _PAIRS[s[0]]
        if opener == closer:
            if s.count(opener) % 2 == 0:
                break
        elif s.count(closer) >= s.count(opener):
            break
        s = s[1:].lstrip()
    while s and s[-1] in _CLOSERS and s[-1] not in "?":
        closer = s[-1]
        openers = [o for o, c in _PAIRS.items() if c == closer]
        if closer in ("'", '"', "`", "*", "_"):
            if s.count(closer) % 2 == 0:
                break
        elif any(s.count(o) >= s.count(closer) for o in openers):
            break
        s = s[:-1].rstrip()
    return s


def _strip_prefixes(s: str, extra: re.Pattern | None = None) -> str:
    for _ in range(8):
        before = s
        s = s.strip()
        s = _PREFIX.sub("", s, count=1)
        if extra is not None:
            s = extra.sub("", s, count=1)
        s = _strip_wrappers(s)
        if s == before.strip():
            break
    return s.strip()


def _prepare_line(line: str) -> str:
    """Line-level cleanup shared by all parsers: fences, markdown bold, JSON-ish punctuation, prefixes."""
    line = _FENCE.sub("", line)
    line = line.replace("**", "").strip()
    if line.startswith("__") or line.endswith("__"):
        line = line.strip("_").strip()
    # JSON-ish list items: ["What is X?", "What is Y?"] or  "What is X?",
    line = re.sub(r"^\[\s*(?=[\"'“])", "", line)
    line = re.sub(r"(?<=[\"'”])\s*\]?\s*,?\s*$", "", line)
    line = line.strip().rstrip(",;").strip()
    line = _strip_prefixes(line)
    return _strip_wrappers(line)


def _is_boundary(text: str, pos: int) -> bool:
    """Is the punctuation at text[pos] a sentence boundary (not an abbreviation or initial)?"""
    ch = text[pos]
    if ch in "!;:":
        return True
    # '.': look at the word before
    word = re.search(r"([\w.]+)\.?$", text[:pos + 1].rstrip("."))
    w = (word.group(1) if word else "").lower().rstrip(".")
    if not w:
        return True
    if w in _ABBREVIATIONS or (len(w) == 1 and w.isalpha()) or re.fullmatch(r"(?:[a-z]\.)+[a-z]", w):
        return False
    return True


def _boundaries(seg: str) -> list[int]:
    """Start offsets of sentences inside `seg` (after '. ', '! ', ': ', '; ' followed by a non-lowercase char)."""
    out = []
    for m in re.finditer(r"[.!;:]+(\s+)(?=[^a-z\s])", seg):
        if _is_boundary(seg, m.start()):
            out.append(m.end())
    return out


def _clean_question(s: str) -> str:
    s = _strip_prefixes(s)
    s = _strip_wrappers(s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"\s+\?", "?", s)
    s = re.sub(r"\?+", "?", s)
    return s.lstrip("¿").strip()


def _is_label(text: str) -> bool:
    """Is `text` nothing but numbering / a 'Question:' label (so it belongs to the question after it)?"""
    t = text.strip()
    return bool(t) and not _strip_prefixes(t).strip(" .:-–—)(")


def _cut_question(seg: str, first: bool) -> tuple[str, str]:
    """Split a '?'-terminated segment into (text before the question, the question)."""
    seg = seg.strip()
    bounds = _boundaries(seg)
    interrogative = [p for p in bounds if is_interrogative(_strip_prefixes(seg[p:]))]
    if is_interrogative(_strip_prefixes(seg)):
        interrogative = [b for b in interrogative if not _is_label(seg[:b])] or [0]
        # "What is X: Is it Y?" stays whole when it opens like a question and nothing before looks like
        # an answer or a preamble; only a later interrogative sentence start after '.', '!' moves the cut.
        interrogative = [b for b in interrogative if b == 0 or seg[:b].rstrip()[-1:] in ".!;"] or [0]
    if interrogative:
        p = interrogative[-1]
    elif first:
        # "Sure! Berlin has how many inhabitants?" -> cut after a preamble-looking sentence
        p = 0
        for b in bounds:
            if _PREAMBLE.match(_strip_prefixes(seg[:b])) or seg[:b].rstrip().endswith(":"):
                p = b
    elif bounds:
        p = bounds[-1]
    else:
        # "Elon Musk When was Tesla founded?" (an answer without a full stop, then the next question)
        m = _INTERROGATIVE_INNER.search(seg)
        p = m.start() if m else 0
    # numbering or a label just before the cut belongs to the question ("Paris. 2. What …?")
    earlier = [0] + [b for b in bounds if b < p]
    for b in reversed(earlier):
        if p and _is_label(seg[b:p]):
            p = b
        else:
            break
    return seg[:p].strip(), seg[p:].strip()


def _clean_answer(a: str) -> str:
    a = _ANSWER_LABEL.sub("", a.strip()).strip()
    a = re.sub(r"(?:^|\s)(?:q|question|query)\s*\d{0,3}\s*:?\s*$", "", a, flags=re.IGNORECASE).strip()
    a = a.strip(" ,;\"'“”")
    a = re.sub(r"\s+", " ", a)
    return a


def _split_line(line: str) -> tuple[list[list[str]], str]:
    """[[question, answer], ...] found on one prepared line, plus the text before the first question."""
    pairs: list[list[str]] = []
    lead = ""
    start = 0
    for m in re.finditer(r"\?+", line):
        seg = line[start:m.end()]
        before, question = _cut_question(seg, first=not pairs)
        if pairs:
            pairs[-1][1] = (pairs[-1][1] + " " + before).strip()
        else:
            lead = before
        pairs.append([question, ""])
        start = m.end()
    tail = line[start:].strip()
    if pairs:
        pairs[-1][1] = tail
        return pairs, lead
    return pairs, tail


def _json_items(text: str) -> list[str] | None:
    """If the reply holds JSON (a list of strings / objects, or {"questions": [...]}), its items as lines."""
    lines = [ln for ln in text.split("\n") if not re.fullmatch(r"\s*(?:```|~~~)[\w+.-]*\s*", ln)]
    starts = [i for i, ln in enumerate(lines) if ln.lstrip()[:1] in ("[", "{")]
    if not starts:
        return None
    i = starts[0]
    ends = [j for j in range(len(lines) - 1, i - 1, -1) if lines[j].rstrip()[-1:] in ("]", "}")]
    if not ends:
        return None
    body = "\n".join(lines[i:ends[0] + 1]).strip()
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        return None
    if not isinstance(data, (list, dict)):
        return None
    out: list[str] = []

    def walk(x) -> None:
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            lower = {str(k).lower(): v for k, v in x.items()}
            q = next((lower[k] for k in ("question", "q", "query", "statement", "fact", "atom", "text") if k in lower), None)
            if isinstance(q, str):
                a = next((lower[k] for k in ("answer", "a") if k in lower), None)
                out.append(f"{q.strip()} {a.strip()}" if isinstance(a, str) and a.strip() else q)
                return
            for k in ("questions", "atoms", "facts", "statements", "items", "pairs", "qa"):
                if k in lower:
                    walk(lower[k])
                    return
            for v in x.values():
                if isinstance(v, (list, dict)):
                    walk(v)

    walk(data)
    return [" ".join(s.split()) for s in out]


def _lines(raw: str | None) -> tuple[list[str], bool]:
    """Prepared, non-empty content lines and whether the reply ended normally (newline / end token / JSON)."""
    if not raw or not str(raw).strip():
        return [], True
    raw = str(raw)
    ended = bool(_END_TOKENS.search(raw[-40:])) or raw.endswith("\n")
    text = clean_text(raw)
    items = _json_items(text)
    if items is not None:
        return [ln for ln in (_prepare_line(s) for s in items) if ln], True
    out = []
    for ln in text.split("\n"):
        if _FENCE.match(ln) and not _FENCE.sub("", ln).strip():
            continue
        if _ROLE_LINE.match(ln):
            continue
        p = _prepare_line(ln)
        if p and re.search(r"\w", p):
            out.append(p)
    return out, ended


def _looks_cut(last: str, others: Iterable[str], ended: bool, truncated: bool | None) -> bool:
    """Was the final line cut off by max_tokens?"""
    if truncated is False or ended or not last:
        return False
    if _TERMINAL.search(last):
        return False
    if truncated:
        return True
    others = list(others)
    if not others:
        return False
    finished = sum(1 for o in others if _TERMINAL.search(o))
    return finished * 2 >= len(others)


def _drop_cut_tail(lines: list[str], ended: bool, truncated: bool | None) -> None:
    """Drop the text after the final '?' of the reply when max_tokens cut it ("…? …? What is the Eif").
    It is neither an answer nor a question. The guess counts the '?'-segments of the final line as
    finished units beside the other lines, so a one-line loop is judged like a multi-line one."""
    marks = list(re.finditer(r"\?+", lines[-1]))
    if not marks:
        return
    head, tail = lines[-1][:marks[-1].end()], lines[-1][marks[-1].end():].strip()
    segments = [seg for seg in re.split(r"(?<=\?)\s+", head) if seg.strip()]
    if tail and _looks_cut(tail, lines[:-1] + segments, ended, truncated):
        lines[-1] = head


def _acceptable(item: str, min_words: int, max_words: int) -> bool:
    words = item.split()
    if len(words) < min_words or len(words) > max_words or len(item) > MAX_CHARS:
        return False
    if not re.search(r"[^\W\d_]", item):
        return False
    if _REPEAT_WORD.search(item):
        return False
    return True


class _Dedup:
    def __init__(self) -> None:
        self.seen: set[str] = set()

    def add(self, item: str) -> bool:
        key = normalize_key(item)
        if not key or key in self.seen:
            return False
        self.seen.add(key)
        return True


# ---- public parsers --------------------------------------------------------------------------------


def _qa_pairs(
    raw: str | None, *, require_qmark: bool, truncated: bool | None, min_words: int, max_words: int
) -> list[tuple[str, str]]:
    lines, ended = _lines(raw)
    if not lines:
        return []
    _drop_cut_tail(lines, ended, truncated)
    last_cut = _looks_cut(lines[-1], lines[:-1], ended, truncated)
    out: list[list[str]] = []
    dedup = _Dedup()
    last_answer: list[str] | None = None  # the pair whose answer came from the final line
    for i, line in enumerate(lines):
        is_last = i == len(lines) - 1
        cut_here = last_cut and is_last
        if _ANSWER_LINE.match(line):
            # two-line format "Q: …?" / "A: …": the answer belongs to the previous question
            if out and not out[-1][1]:
                out[-1][1] = _clean_answer(line)
                if is_last:
                    last_answer = out[-1]
            continue
        pairs, rest = _split_line(line)
        if not require_qmark and not cut_here:
            tail = pairs[-1][1] if pairs else rest
            t = _clean_question(tail) if tail else ""
            if t and is_interrogative(t) and not t.endswith(":"):
                if pairs:
                    pairs[-1][1] = ""
                pairs.append([re.sub(r"[\s.!;:,]+$", "", t) + "?", ""])
        for q, a in pairs:
            q = _clean_question(q)
            a = _clean_answer(a)
            if not _acceptable(q, min_words, max_words) or _META.search(q):
                continue
            if dedup.add(q):
                out.append([q, a])
                if is_last:
                    last_answer = out[-1]
            elif a:
                # a repeated question may bring the answer its first copy lacked
                key = normalize_key(q)
                for pair in out:
                    if not pair[1] and normalize_key(pair[0]) == key:
                        pair[1] = a
                        break
    if last_answer is not None and last_answer[1] and not ended and truncated is not False:
        # an answer cut off by max_tokens: drop it (the question itself was complete). Unless the caller
        # says so, guess from the other answers: cut if most of them end with punctuation and this not.
        others = [p[1] for p in out if p is not last_answer and p[1]]
        if _looks_cut(last_answer[1], others, ended, truncated):
            last_answer[1] = ""
    return [(q, a) for q, a in out]


def parse_questions(
    raw: str | None,
    *,
    max_questions: int | None = None,
    require_qmark: bool = True,
    truncated: bool | None = None,
    min_words: int = MIN_WORDS,
    max_words: int = MAX_QUESTION_WORDS,
) -> list[str]:
    """Questions in `raw`, cleaned, deduplicated, in order; [] for an empty or None reply.

    `require_qmark=False` also keeps lines that open like a question (wh-word or auxiliary verb) and adds
    the "?". `truncated`: True when the caller knows the reply hit max_tokens (finish_reason "length"),
    False when it knows it did not, None to guess (the last line lacks end punctuation while most other
    lines have it, and the reply does not end with a newline or an end token). A cut last line never
    yields a question unless its "?" was reached. `max_questions` keeps the first N after dedup.
    """
    pairs = _qa_pairs(raw, require_qmark=require_qmark, truncated=truncated, min_words=min_words, max_words=max_words)
    qs = [q for q, _ in pairs]
    return qs[:max_questions] if max_questions is not None else qs


def parse_qa(
    raw: str | None,
    *,
    max_pairs: int | None = None,
    truncated: bool | None = None,
    min_words: int = MIN_WORDS,
    max_words: int = MAX_QUESTION_WORDS,
) -> list[tuple[str, str]]:
    """QuOTE 'Question? Answer' pairs (also 'Q: …?' / 'A: …' on two lines). The answer is '' when missing
    or cut off by max_tokens. Questions equal `parse_questions(raw)`."""
    pairs = _qa_pairs(raw, require_qmark=True, truncated=truncated, min_words=min_words, max_words=max_words)
    return pairs[:max_pairs] if max_pairs is not None else pairs


def _sentences(line: str) -> list[str]:
    parts, start = [], 0
    for m in re.finditer(r"[.!?]+[\"'”’)\]]*(\s+)(?=[^a-z\s])", line):
        if line[m.start()] == "." and not _is_boundary(line, m.start()):
            continue
        parts.append(line[start:m.start(1)].strip())
        start = m.end()
    parts.append(line[start:].strip())
    return [p for p in parts if p]


def parse_atoms(
    raw: str | None,
    *,
    max_atoms: int | None = None,
    truncated: bool | None = None,
    min_words: int = MIN_WORDS,
    max_words: int = MAX_ATOM_WORDS,
    split_sentences: bool = True,
) -> list[str]:
    """Atomic statements, one per line: numbering/bullets/"Fact 1:" labels stripped, preambles and sign-offs
    dropped, a line holding several sentences split into them, duplicates removed, a cut last line dropped."""
    lines, ended = _lines(raw)
    if not lines:
        return []
    lines = [_strip_prefixes(ln, _ATOM_PREFIX) for ln in lines]
    lines = [ln for ln in lines if ln]
    if not lines:
        return []
    if _looks_cut(lines[-1], lines[:-1], ended, truncated):
        lines = lines[:-1]
    out: list[str] = []
    dedup = _Dedup()
    for line in lines:
        if line.rstrip().endswith(":") or _META.search(line):
            continue
        pieces = _sentences(line) if split_sentences else [line]
        for piece in pieces:
            piece = _strip_wrappers(re.sub(r"\s+", " ", piece)).strip()
            if _PREAMBLE.match(piece) and (piece.endswith(":") or "fact" in piece.lower() or "statement" in piece.lower()):
                continue
            if piece.endswith(":") or not _acceptable(piece, min_words, max_words):
                continue
            if dedup.add(piece):
                out.append(piece)
    return out[:max_atoms] if max_atoms is not None else out


def strip_reply_format(raw: str | None) -> str:
    """A free-text reply (an answer, a passage) without chat tokens, <think> blocks, code-fence and role
    lines, or a leading "Answer:" label."""
    text = clean_text(raw)
    text = "\n".join(ln for ln in text.split("\n") if not _FENCE.fullmatch(ln.strip()) and not _ROLE_LINE.match(ln))
    return _ANSWER_LABEL.sub("", text.strip(), count=1).strip() if _ANSWER_LINE.match(text.strip()) else text.strip()


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
