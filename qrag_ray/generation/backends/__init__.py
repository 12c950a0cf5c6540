"""Generator backends: a Ray Dataset of requests -> a Dataset of raw LLM outputs.

Contract (docs/ARCHITECTURE.md)::

    run(ds: ray.data.Dataset, cfg: GeneratorConfig, model_path: str | None) -> ray.data.Dataset
      in  rows: {"key": str, "messages": [{"role": str, "content": str}, ...]}
      out rows: {"key": str, "raw": str, "prompt_tokens": int, "output_tokens": int}

- `vllm`   (qrag_ray.generation.backends.vllm): Ray Data LLM processor over vLLM, GPU or the CPU build.
- `openai` (qrag_ray.generation.backends.openai): any OpenAI-compatible `/chat/completions` endpoint.

The modules import their heavy dependencies lazily, so importing this package is cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from qrag_ray.errors import QragError

BACKENDS = ("vllm", "openai")


def get_backend(name: str) -> Callable:
    """The `run` function of a backend by name."""
    if name not in BACKENDS:
        raise QragError(f"unknown generator backend '{name}' (known: {', '.join(BACKENDS)})")
    return importlib.import_module(f"{__name__}.{name}").run


__all__ = ["BACKENDS", "get_backend"]
