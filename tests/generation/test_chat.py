"""`get_chat_model`: the online chat model over the OpenAI-compatible endpoint (the fake server), and the
choice of backend. The vLLM chat model runs for real in test_vllm_cpu.py (slow)."""

from __future__ import annotations

import asyncio

import pytest

from fake_openai_server import rule_based_reply
from qrag_ray.config.llm import GeneratorConfig
from qrag_ray.errors import QragError
from qrag_ray.generation.chat import ChatModel, OpenAIChatModel, VLLMChatModel, get_chat_model
from qrag_ray.generation.parsing import parse_output
from qrag_ray.generation.prompts import get_prompt


def _cfg(fake, **options) -> GeneratorConfig:
    return GeneratorConfig(backend="openai", base_url=fake.base_url, model="fake-model",
                           api_key_env="QRAG_TEST_OPENAI_KEY", **options)


def test_openai_complete(fake_openai):
    model = get_chat_model(_cfg(fake_openai))
    assert isinstance(model, OpenAIChatModel) and isinstance(model, ChatModel)
    msgs = get_prompt("hyde").render("Where is the Eiffel Tower?")
    text = model.complete(msgs, max_tokens=40, temperature=0.2)
    assert text == rule_based_reply(msgs)  # the endpoint's reply, unchanged
    body = fake_openai.bodies[-1]
    assert body["max_tokens"] == 40 and body["temperature"] == 0.2 and body["messages"] == msgs
    assert parse_output(text, "text") == [text.strip()]
    model.close()


def test_openai_acomplete_and_retry(fake_openai):
    model = get_chat_model(_cfg(fake_openai).model_dump())  # a plain dict config works too
    fake_openai.fail_next(503, retry_after="0")

    async def ask():
        try:
            return await model.acomplete([{"role": "user", "content": "Paris is in France."}], max_tokens=16)
        finally:
            await model.aclose()

    assert "Paris" in asyncio.run(ask())
    assert fake_openai.chat_requests == 2


def test_openai_complete_works_in_two_event_loops(fake_openai):
    """Serve replicas and FastAPI handlers each have their own loop; the model must not be bound to one."""
    model = get_chat_model(_cfg(fake_openai))
    msgs = [{"role": "user", "content": "Berlin is a city."}]
    assert asyncio.run(model.acomplete(msgs)) == asyncio.run(model.acomplete(msgs))
    assert fake_openai.chat_requests == 2


@pytest.mark.parametrize("messages,match", [
    ([], "non-empty list"),
    ([{"role": "user"}], "bad chat message"),
    ("hello", "non-empty list"),
])
def test_bad_messages(fake_openai, messages, match):
    model = get_chat_model(_cfg(fake_openai))
    with pytest.raises(QragError, match=match):
        model.complete(messages)
    assert fake_openai.chat_requests == 0


def test_bad_arguments(fake_openai):
    model = get_chat_model(_cfg(fake_openai))
    msgs = [{"role": "user", "content": "x y z"}]
    with pytest.raises(QragError, match="max_tokens must be >= 1"):
        model.complete(msgs, max_tokens=0)
    with pytest.raises(QragError, match="temperature must be >= 0"):
        asyncio.run(model.acomplete(msgs, temperature=-1))
    assert fake_openai.chat_requests == 0


def test_openai_errors_are_user_errors(fake_openai, closed_port_url):
    fake_openai.require_key = "sk-x"
    with pytest.raises(QragError, match="HTTP 401"):
        get_chat_model(_cfg(fake_openai)).complete([{"role": "user", "content": "hi there you"}])
    cfg = GeneratorConfig(backend="openai", base_url=closed_port_url)
    with pytest.raises(QragError, match="cannot connect"):
        get_chat_model(cfg).complete([{"role": "user", "content": "hi there you"}])


def test_backend_choice(tmp_path):
    with pytest.raises(QragError, match="no chat model for generator.backend='none'"):
        get_chat_model(GeneratorConfig(backend="none"))
    with pytest.raises(QragError, match="needs generator.base_url"):
        get_chat_model(GeneratorConfig(backend="openai"))
    # vllm: constructed lazily (no engine until first use), but the model folder is checked at once
    with pytest.raises(QragError, match="not an HF model folder"):
        get_chat_model(GeneratorConfig(backend="vllm"), model_path=str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    model = get_chat_model(GeneratorConfig(backend="vllm"), model_path=str(tmp_path))
    assert isinstance(model, VLLMChatModel) and model._engine is None
    model.close()  # closing a never-started engine is fine
