"""Generator backends: a Ray Dataset of requests {key, messages} -> a Dataset of raw LLM outputs {key, raw,
prompt_tokens, output_tokens}; each module's `run(ds, cfg, model_path)` follows the contract in
docs/ARCHITECTURE.md and imports its heavy dependencies lazily: `vllm` (Ray Data LLM processor, GPU or the
CPU build) and `openai` (any OpenAI-compatible `/chat/completions` endpoint).
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
