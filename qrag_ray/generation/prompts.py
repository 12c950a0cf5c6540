"""Versioned prompt templates for question generation, atomisation, HyDE and answer synthesis: the YAML
files of prompt_templates/, their placeholders and versioning as docs/ARCHITECTURE.md ("Prompt
templates") says. The Raina & Gales (2024) templates take their strings from the authors' released code
(VatsalRaina/QARAG, qarag/zero-shot/), as the seed text lost the paper's Table 2.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from qrag_ray.errors import QragError

OutputKind = Literal["questions", "qa", "atoms", "text"]
OUTPUT_KINDS: tuple[str, ...] = ("questions", "qa", "atoms", "text")

Message = dict[str, str]

_PLACEHOLDER = re.compile(r"( ?)\{(text|n|context)\}")


@dataclass(frozen=True)
class PromptTemplate:
    """One prompt. `render` turns it into chat messages; `output` tells the parser what to expect."""

    name: str
    version: str  # "<name>@<int>", bumped by hand on deliberate changes
    user: str
    system: str | None = None
    output: OutputKind = "questions"
    few_shot: tuple[tuple[str, str], ...] = ()  # (user, assistant) turns placed before the real one
    count_exact: str = "Write exactly {n} questions."  # {n} here is the number
    count_free: str = ""  # phrase used when n is None (the LLM decides); "" drops it
    count_one: str | None = None  # phrase for n == 1 when the plural wording would be wrong
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.output not in OUTPUT_KINDS:
            raise QragError(f"prompt '{self.name}': output must be one of {', '.join(OUTPUT_KINDS)}, "
                            f"got '{self.output}'")
        if "{text}" not in self.user and "{text}" not in (self.system or ""):
            raise QragError(f"prompt '{self.name}': the template has no {{text}} placeholder")
        # accept lists (from YAML/JSON) but store tuples so the template stays hashable and frozen
        object.__setattr__(self, "few_shot", tuple((str(u), str(a)) for u, a in self.few_shot))

    @property
    def uses_context(self) -> bool:
        return "{context}" in self.user or "{context}" in (self.system or "")

    def count_phrase(self, n: int | None) -> str:
        """The words that replace {n}: exact count for an int, `count_free` for None."""
        if n is None:
            return self.count_free
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise QragError(f"prompt '{self.name}': the number of questions must be a positive integer or None, "
                            f"got {n!r}")
        if n == 1 and self.count_one is not None:
            return self.count_one
        return self.count_exact.replace("{n}", str(n))

    def render(self, text: str, n: int | None = None, context: str | Sequence[str] | None = None) -> list[Message]:
        """Chat messages for one request: [system], few-shot turns, then the user turn with `text`.

        `n`: an int asks for exactly that many items; None lets the LLM decide. `context`: the chunk for
        atom prompts, or the retrieved chunks (a list is numbered "[1] …") for `answer`.
        """
        if text is None:
            raise QragError(f"prompt '{self.name}': no text to render")
        if self.uses_context and context is None:
            raise QragError(f"prompt '{self.name}' needs a context (the chunk or the retrieved passages)")
        values = {"text": str(text), "n": self.count_phrase(n), "context": format_context(context)}
        messages = [{"role": "system", "content": _fill(self.system, values)}] if self.system else []
        for user, assistant in self.few_shot:
            messages += [{"role": "user", "content": _fill(user, values)}, {"role": "assistant", "content": assistant}]
        return messages + [{"role": "user", "content": _fill(self.user, values)}]

    @property
    def full_version(self) -> str:
        """'<version>-<sha256[:8] of everything that decides what is sent and how it is parsed>'."""
        parts = {"system": self.system, "user": self.user, "output": self.output,
                 "few_shot": [list(t) for t in self.few_shot], "count_exact": self.count_exact,
                 "count_free": self.count_free, "count_one": self.count_one}
        blob = json.dumps(parts, sort_keys=True, ensure_ascii=False)
        return f"{self.version}-{hashlib.sha256(blob.encode('utf-8')).hexdigest()[:8]}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"few_shot": [list(t) for t in self.few_shot]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PromptTemplate":
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(data) - known):
            raise QragError(f"prompt template: unknown field(s) {', '.join(unknown)} "
                            f"(known: {', '.join(sorted(known))})")
        if missing := [k for k in ("name", "user") if not data.get(k)]:
            raise QragError(f"prompt template: missing field(s) {', '.join(missing)}")
        data = dict(data)
        data.setdefault("version", f"{data['name']}@1")
        data["few_shot"] = tuple(tuple(t) for t in data.get("few_shot") or ())
        if any(len(t) != 2 for t in data["few_shot"]):
            raise QragError(f"prompt '{data['name']}': each few_shot entry must be a [user, assistant] pair")
        return cls(**data)


def _fill(template: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: m.group(1) + values[m.group(2)] if values[m.group(2)] else "", template)


FENCE_OPEN = "<<<"
FENCE_CLOSE = ">>>"


def fence(text: str) -> str:
    """A passage as quoted data: fenced, with fence markers inside it defused, so a document that says
    "ignore the above and ..." cannot close the quote and speak as the prompt."""
    body = str(text).strip().replace(FENCE_OPEN, "< < <").replace(FENCE_CLOSE, "> > >")
    return f"{FENCE_OPEN}\n{body}\n{FENCE_CLOSE}"


def format_context(context: str | Sequence[str] | None) -> str:
    """A list of passages becomes '[1]\\n<<<\\nfirst\\n>>>\\n\\n[2] ...' (fenced); a string is used as is."""
    if context is None or isinstance(context, str):
        return context or ""
    return "\n\n".join(f"[{i}]\n{fence(c)}" for i, c in enumerate(context, 1))


def load_prompt_file(path: str | Path) -> PromptTemplate:
    """A custom template from YAML/JSON holding PromptTemplate fields (name, user, [system, output, ...])."""
    from qrag_ray.config.yaml_file import read_yaml

    file = Path(path)
    data = read_yaml(file, "prompt file")  # YAML is a superset of JSON: one reader for both
    if not isinstance(data, dict):
        raise QragError(f"prompt file {file} must hold a mapping of PromptTemplate fields")
    try:
        return PromptTemplate.from_dict(data)
    except TypeError as error:
        raise QragError(f"prompt file {file}: {error}") from None


# The shipped templates, listed for a stable order.
TEMPLATES_DIR = Path(__file__).resolve().parent / "prompt_templates"
TEMPLATE_NAMES = ("hype", "hype-fewshot", "quote-basic", "quote-complex", "quote-multihop-basic",
                  "quote-multihop-complex", "blog", "atomize", "atom-question", "atom-question-fewshot", "hyde",
                  "hyde-sentence", "answer")


def _load_builtin(name: str) -> PromptTemplate:
    template = load_prompt_file(TEMPLATES_DIR / f"{name}.yaml")
    if template.name != name:
        raise QragError(f"{TEMPLATES_DIR / (name + '.yaml')} holds template '{template.name}', not '{name}'")
    return template


PROMPTS: dict[str, PromptTemplate] = {n: _load_builtin(n) for n in TEMPLATE_NAMES}

# What an answer prompt must reply when the passages do not support an answer (serving.answer.parse_answer).
DONT_KNOW = "I don't know"


def get_prompt(name: str) -> PromptTemplate:
    """The template registered under `name`, or one loaded from a .yaml/.yml/.json file path."""
    if isinstance(name, PromptTemplate):
        return name
    if name in PROMPTS:
        return PROMPTS[name]
    if isinstance(name, str) and name.lower().endswith((".yaml", ".yml", ".json")):
        return load_prompt_file(name)
    raise QragError(f"unknown prompt '{name}' (known: {', '.join(sorted(PROMPTS))}, "
                    "or a path to a .yaml/.json template)")


def prompt_version(name: str | PromptTemplate) -> str:
    """Cache-key identity of a prompt: changes whenever its text, few-shot turns, count wording or output kind
    change (`PromptTemplate.full_version`)."""
    return get_prompt(name).full_version
