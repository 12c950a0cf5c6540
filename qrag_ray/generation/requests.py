"""Chunks -> LLM requests with content-addressed cache keys (pure).

The key hashes everything that decides the output — model, backend, prompt version, sampling, the
question count, and the texts — so a re-run pays only for new or changed chunks, a prompt edit
invalidates exactly what it should, and an index is reproducible from the cache.
"""

from __future__ import annotations

import hashlib
import json

from qrag_ray.config.llm import GeneratorConfig


def cache_key(model_id: str, prompt_version: str, sampling: dict, n: int | None, text: str,
              context: str | None = None) -> str:
    payload = {"m": model_id, "p": prompt_version, "s": sampling, "n": n, "t": text, "c": context}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def model_id(cfg: GeneratorConfig) -> str:
    return f"{cfg.backend}:{cfg.model}"


def make_request(cfg: GeneratorConfig, template_name: str, text: str, n: int | None,
                 context: str | None = None) -> dict:
    from qrag_ray.generation.prompts import get_prompt, prompt_version

    tpl = get_prompt(template_name)
    key = cache_key(model_id(cfg), prompt_version(tpl), cfg.sampling.model_dump(), n, text, context)
    return {"key": key, "messages": tpl.render(text, n=n, context=context), "output": tpl.output}


def question_requests(chunk: dict, atoms: list[str] | None, cfg: GeneratorConfig, granularity: str) -> list[dict]:
    """Question requests for one chunk: one per chunk, or one per atom with the chunk as context.
    Each request carries `unit` (-1 for the chunk, else the atom's position) to regroup answers."""
    if granularity == "chunk":
        return [make_request(cfg, cfg.prompt, chunk["text"], cfg.questions) | {"unit": -1, "atom": ""}]
    return [make_request(cfg, cfg.atom_prompt, atom, cfg.questions_per_atom, context=chunk["text"])
            | {"unit": i, "atom": atom} for i, atom in enumerate(atoms or [])]


def atomize_request(chunk: dict, cfg: GeneratorConfig) -> dict:
    return make_request(cfg, cfg.atomize_prompt, chunk["text"], None) | {"unit": -1}
