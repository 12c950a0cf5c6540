"""The test corpus: topics of the Python language reference (pydoc_data ships with Python), unwrapped like
`qrag demo` does so sentences are not cut at line ends, written as JSONL."""

from __future__ import annotations

import json
from pathlib import Path

# Python language reference topics (pydoc_data ships with Python) with questions a reader would ask,
# given as the `questions` column for `--generator precomputed` (no LLM in the fast suite).
# "break" holds near-duplicate questions (Q-Q pruning removes some); "pass" holds off-topic ones
# (the question-chunk filter drops all of them, so its chunk must fall back to its own text vector).
PYDOC_QUESTIONS: dict[str, list[str]] = {
    "assert": ["What does the assert statement do?", "When are assert statements removed?",
               "What exception does a failing assert raise?"],
    "async": ["How do I write an asynchronous for loop?", "What is an async with statement?",
              "Where can await be used?"],
    "augassign": ["What is augmented assignment?", "Is x += 1 evaluated in place?"],
    "binary": ["Which operators are binary arithmetic operators?", "What does the @ operator do?",
               "How does floor division work?"],
    "break": ["What does the break statement do?", "What does the break statement do in Python?",
              "What does a break statement do?", "Does break skip the else clause of a loop?"],
    "continue": ["What does continue do in a loop?", "Can continue be used in a finally clause?"],
    "del": ["How does the del statement delete names?", "What happens when you delete a slice?"],
    "for": ["When does the else clause of a for loop run?", "Can I modify the sequence I iterate over?",
            "How does a for loop assign to its target list?"],
    "if": ["How does an if statement choose a branch?", "What is elif?"],
    "lambda": ["What is a lambda expression?", "Can a lambda contain statements?"],
    "pass": ["What is the capital of France?", "Who painted the Mona Lisa?"],
    "return": ["What does return do inside a generator?", "What happens to return in a try with finally?"],
    "while": ["When does a while loop stop?", "When is the else clause of a while loop executed?"],
    "with": ["How do I make an object usable in a with statement?", "What does __exit__ receive?",
             "Can one with statement hold several context managers?"],
}


def pydoc_docs(with_questions: bool = True) -> list[dict]:
    """The corpus records, unwrapped like `qrag demo` does so sentences are not cut at line ends."""
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    out = []
    for name, questions in PYDOC_QUESTIONS.items():
        rec = {"id": name, "title": f"The {name} topic", "text": unwrap(topics[name])}
        if with_questions:
            rec["questions"] = list(questions)
        out.append(rec)
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def topic_records(names: list[str], metadata: bool = False) -> list[dict]:
    """Records for the named topics, each titled by its first line (the serving tests' tenants); with
    `metadata` each also has a url and the fields of `topic_metadata`."""
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    out = []
    for i, name in enumerate(names):
        text = unwrap(topics[name])
        rec = {"id": name, "title": text.splitlines()[0].strip(), "text": text}
        if metadata:
            rec |= {"url": f"https://docs.python.org/3/reference/{name}.html", "metadata": topic_metadata(i, name)}
        out.append(rec)
    return out


def topic_metadata(number: int, name: str) -> dict:
    """The i-th topic's metadata, one field of each type: `area` (string), `order` (number), `statement`
    (bool), `added` (date), `reviewed` (datetime), `letters` (list of strings)."""
    return {"area": ("loops", "values", "names")[number % 3], "order": number, "statement": number % 2 == 0,
            "added": f"2024-03-{1 + number:02d}", "reviewed": f"2024-04-01T{number:02d}:15:00Z",
            "letters": sorted(set(name[:3]))}
