"""Fixtures for the generation tests. `fake_openai` is the suite's one fake, the OpenAI-compatible
server of tests/fake_openai_server.py (a hosted LLM API is an external service we cannot run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fake_openai_server import running_fake_openai

LLM_OUTPUTS = Path(__file__).resolve().parents[1] / "data" / "llm_outputs"


@pytest.fixture
def fake_openai():
    """A running fake OpenAI-compatible server (tests/fake_openai_server.py). Stopped after the test."""
    with running_fake_openai() as state:
        yield state


@pytest.fixture
def closed_port_url() -> str:
    """A base_url on which nothing listens (a port that was free a moment ago)."""
    from qrag_ray.runtime.ports import free_port

    return f"http://127.0.0.1:{free_port()}/v1"
