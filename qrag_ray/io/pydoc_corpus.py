"""A real corpus that ships with Python, the language reference bundled for `help()` (`pydoc_data.topics`):
one JSONL document per topic, so the demo, tests and benchmarks need no download."""

from __future__ import annotations

import json
import re
from pathlib import Path

from qrag_ray.errors import QragError

DEMO_QUERIES = (
    "When does the else clause of a for loop run?",
    "How do I make an object usable in a with statement?",
    "What happens if an exception is raised inside a finally clause?",
)
# The topics that answer each demo question (a hit on one of them is marked in the table).
DEMO_EXPECTED = dict(zip(DEMO_QUERIES, [("for", "while", "break"), ("context-managers", "with"), ("try",)],
                         strict=True))
# The statements part of the language reference: every demo answer plus topics that compete for the same
# words (`async with`, `raise` and `exceptions` on finally), in about 30 chunks of 200 tokens (LLM prompts).
DEMO_TOPICS = ("assert", "async", "break", "context-managers", "continue", "del", "exceptions", "for",
               "if", "pass", "raise", "return", "try", "while", "with", "yield")


def unwrap(text: str) -> str:
    """Join the topics' hard-wrapped lines into paragraphs, so a sentence is not cut at a line end."""
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(p for p in paras if p)


def write_pydoc_corpus(path: Path, topics: tuple[str, ...] | list[str] | None = None) -> int:
    """One JSONL document per help topic (all of them, or `topics`); returns the number written."""
    from pydoc_data.topics import topics as all_topics

    names = sorted(all_topics) if not topics else list(topics)
    if unknown := [t for t in names if t not in all_topics]:
        raise QragError(f"unknown pydoc topic(s) {unknown} (see `python -c \"import pydoc_data.topics as t; "
                        "print(sorted(t.topics))\"`)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for name in names:
            text = unwrap(all_topics[name])
            title = text.splitlines()[0].strip() if text else name
            file.write(json.dumps({"id": name, "title": title, "text": text}) + "\n")
    return len(names)
