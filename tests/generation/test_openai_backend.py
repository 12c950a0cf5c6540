"""The OpenAI-compatible backend against a real HTTP endpoint (the fake server): request body, usage,
retries with backoff, clear errors, concurrency bounds, the Ray Data stage, and the CLI's one-line
errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qrag_ray.config.llm import GeneratorConfig, SamplingConfig
from qrag_ray.errors import QragError
from qrag_ray.generation.backends import get_backend
from qrag_ray.generation.backends.openai import OpenAIChatClient, _OpenAIStage, preflight

MSGS = [{"role": "system", "content": "Write exactly 2 questions."},
        {"role": "user", "content": "Berlin is the capital of Germany."}]
REPO = Path(__file__).resolve().parents[2]


def _cfg(fake_or_url, **options) -> GeneratorConfig:
    url = fake_or_url if isinstance(fake_or_url, str) else fake_or_url.base_url
    options.setdefault("api_key_env", "QRAG_TEST_OPENAI_KEY")
    return GeneratorConfig(backend="openai", base_url=url, model="fake-model", **options)


def _client(fake, **options) -> OpenAIChatClient:
    """Small backoff so retry tests run in milliseconds; the delays are checked separately."""
    options.setdefault("backoff_base_s", 0.01)
    options.setdefault("backoff_max_s", 0.05)
    return OpenAIChatClient(_cfg(fake), **options)


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv("QRAG_TEST_OPENAI_KEY", raising=False)


# ---- request and response ---------------------------------------------------------------------------

def test_chat_sends_sampling_and_reads_usage(fake_openai):
    cfg = _cfg(fake_openai, sampling=SamplingConfig(temperature=0.3, top_p=0.9, max_tokens=77, seed=5),
               engine_kwargs={"repetition_penalty": 1.1})
    reply = OpenAIChatClient(cfg).chat(MSGS)
    assert reply["texts"] == ["1. What does the text say about Berlin?\n2. What does the text say about capital?\n"]
    body = fake_openai.bodies[-1]
    assert body["model"] == "fake-model" and body["messages"] == MSGS
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.3, 0.9, 77, 5)
    assert body["repetition_penalty"] == 1.1  # engine_kwargs reach the body
    assert "n" not in body  # n=1 is the API default; non-default fields are only sent when needed
    # token counts come from the endpoint's `usage`, not from a local tokenizer
    assert reply["prompt_tokens"] == len(" ".join(m["content"] for m in MSGS).split())
    assert reply["output_tokens"] == len(reply["texts"][0].split())
    assert reply["finish_reasons"] == ["stop"]


def test_n_candidates_and_per_call_overrides(fake_openai):
    client = OpenAIChatClient(_cfg(fake_openai, sampling=SamplingConfig(n=3)))
    reply = client.chat(MSGS, max_tokens=5, temperature=0.0, seed_offset=2)
    assert len(reply["texts"]) == 3
    body = fake_openai.bodies[-1]
    assert body["n"] == 3 and body["max_tokens"] == 5 and body["seed"] == 2


def test_parse_response_shapes():
    reply = OpenAIChatClient.parse_response({"choices": [{"index": 1, "text": "b"},
                                                         {"index": 0, "message": {"content": "a"}}]})
    assert reply["texts"] == ["a", "b"] and reply["prompt_tokens"] == 0 and reply["output_tokens"] == 0  # no usage: 0
    with pytest.raises(QragError, match="unexpected body"):
        OpenAIChatClient.parse_response({"error": "nope"})


def test_api_key_header_only_when_set(fake_openai, monkeypatch):
    OpenAIChatClient(_cfg(fake_openai)).chat(MSGS)
    assert fake_openai.auth_headers[-1] is None
    monkeypatch.setenv("QRAG_TEST_OPENAI_KEY", "sk-test")
    OpenAIChatClient(_cfg(fake_openai)).chat(MSGS)
    assert fake_openai.auth_headers[-1] == "Bearer sk-test"


# ---- retries ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("statuses", [(429,), (500, 502), (503, 504, 429)])
def test_retries_429_and_5xx_then_succeeds(fake_openai, statuses):
    fake_openai.fail_next(*statuses)
    reply = _client(fake_openai).chat(MSGS)
    assert reply["texts"] and fake_openai.chat_requests == len(statuses) + 1


def test_retry_after_is_honoured(fake_openai):
    fake_openai.fail_next(429, retry_after="0.4")
    started = time.perf_counter()
    _client(fake_openai, backoff_max_s=5).chat(MSGS)
    assert time.perf_counter() - started >= 0.4
    assert fake_openai.chat_requests == 2


def test_retry_after_is_capped(fake_openai):
    fake_openai.fail_next(503, retry_after="3600")
    started = time.perf_counter()
    _client(fake_openai, backoff_max_s=0.1).chat(MSGS)
    assert time.perf_counter() - started < 5


def test_backoff_grows_exponentially_with_jitter(fake_openai):
    client = _client(fake_openai, backoff_base_s=1.0, backoff_max_s=30.0)
    for attempt, full in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (6, 30.0)]:
        delays = [client._delay(attempt) for _ in range(50)]
        assert all(full / 2 <= d <= full for d in delays), (attempt, min(delays), max(delays))
        assert len(set(delays)) > 1  # jittered


def test_gives_up_after_max_retries(fake_openai):
    fake_openai.fail_next(500, 500, 500, 500)
    with pytest.raises(QragError, match=r"kept failing after 3 attempts \(HTTP 500"):
        _client(fake_openai, max_retries=2).chat(MSGS)
    assert fake_openai.chat_requests == 3


@pytest.mark.parametrize("status", [400, 422])
def test_other_4xx_fail_at_once(fake_openai, status):
    fake_openai.fail_next(status)
    with pytest.raises(QragError, match=f"HTTP {status}: scripted failure {status}"):
        _client(fake_openai).chat(MSGS)
    assert fake_openai.chat_requests == 1


def test_async_chat_retries(fake_openai):
    fake_openai.fail_next(429, 502)
    client = _client(fake_openai)

    async def ask_all():
        try:
            return await client.achat(MSGS)
        finally:
            await client.aclose()

    assert asyncio.run(ask_all())["texts"] and fake_openai.chat_requests == 3


# ---- clear errors ----------------------------------------------------------------------------------

def test_401_is_a_one_line_error_naming_the_key_variable(fake_openai, monkeypatch):
    fake_openai.require_key = "sk-right"
    with pytest.raises(QragError) as raised:
        _client(fake_openai).chat(MSGS)
    msg = str(raised.value)
    assert "HTTP 401" in msg and "$QRAG_TEST_OPENAI_KEY" in msg and "is NOT set" in msg and "\n" not in msg
    assert fake_openai.chat_requests == 1  # not retried
    monkeypatch.setenv("QRAG_TEST_OPENAI_KEY", "sk-wrong")
    with pytest.raises(QragError, match="it is set"):
        _client(fake_openai).chat(MSGS)
    monkeypatch.setenv("QRAG_TEST_OPENAI_KEY", "sk-right")
    assert _client(fake_openai).chat(MSGS)["texts"]


def test_404_points_at_base_url(fake_openai):
    cfg = _cfg(fake_openai.base_url.removesuffix("/v1") + "/wrong")
    with pytest.raises(QragError, match="HTTP 404 .* check generator.base_url"):
        OpenAIChatClient(cfg, backoff_base_s=0.01).chat(MSGS)


def test_connection_refused_is_a_clear_error(closed_port_url):
    with pytest.raises(QragError) as raised:
        OpenAIChatClient(_cfg(closed_port_url), backoff_base_s=0.01).chat(MSGS)
    msg = str(raised.value)
    assert msg.startswith(f"cannot connect to the OpenAI-compatible endpoint {closed_port_url}")
    assert "\n" not in msg and raised.value.__cause__ is None


def test_async_errors_match_sync(fake_openai, closed_port_url):
    """achat and chat share one judgement of each attempt: same refusal message, same no-retry 4xx."""
    async def ask_all(client):
        try:
            return await client.achat(MSGS)
        finally:
            await client.aclose()

    with pytest.raises(QragError, match=f"^cannot connect to the OpenAI-compatible endpoint {closed_port_url}"):
        asyncio.run(ask_all(OpenAIChatClient(_cfg(closed_port_url), backoff_base_s=0.01)))
    fake_openai.fail_next(400)
    with pytest.raises(QragError, match="HTTP 400"):
        asyncio.run(ask_all(_client(fake_openai)))
    assert fake_openai.chat_requests == 1  # a 400 is not retried


def test_missing_base_url():
    with pytest.raises(QragError, match="needs generator.base_url"):
        OpenAIChatClient(GeneratorConfig(backend="none"))


def test_preflight(fake_openai, closed_port_url):
    preflight(_cfg(fake_openai))
    assert fake_openai.model_requests == 1 and fake_openai.chat_requests == 0
    fake_openai.require_key = "sk-right"
    with pytest.raises(QragError, match="HTTP 401"):
        preflight(_cfg(fake_openai))
    with pytest.raises(QragError, match="cannot connect"):
        preflight(_cfg(closed_port_url))


def test_get_backend():
    from qrag_ray.generation.backends import openai, vllm

    assert get_backend("openai") is openai.run and get_backend("vllm") is vllm.run
    with pytest.raises(QragError, match="unknown generator backend 'x'"):
        get_backend("x")


# ---- concurrency -------------------------------------------------------------------------------------

def test_stage_bounds_parallel_requests_and_keeps_row_order(fake_openai):
    import numpy as np

    fake_openai.delay_s = 0.15
    stage = _OpenAIStage(_cfg(fake_openai, max_parallel_requests=3).model_dump_json())
    texts = [f"Topic{i} is a subject." for i in range(9)]
    messages = np.empty(9, dtype=object)  # one list of messages per row, as the pipeline builds them
    for i, text in enumerate(texts):
        messages[i] = [{"role": "user", "content": text}]
    batch = {"key": np.asarray([f"k{i}" for i in range(9)], dtype=object), "messages": messages}
    started = time.perf_counter()
    out = stage(batch)
    elapsed = time.perf_counter() - started
    assert fake_openai.max_inflight == 3  # parallel, but never more than max_parallel_requests
    assert elapsed < 9 * 0.15  # faster than sequential
    assert list(out["key"]) == [f"k{i}" for i in range(9)]
    for i, raw in enumerate(out["raw"]):
        assert f"Topic{i}" in raw  # each output belongs to its own row
    assert out["prompt_tokens"].dtype == np.int64 and (out["output_tokens"] > 0).all()


def test_chat_model_bounds_concurrency(fake_openai):
    from qrag_ray.generation.chat import get_chat_model

    fake_openai.delay_s = 0.1
    model = get_chat_model(_cfg(fake_openai, max_parallel_requests=2))

    async def ask_all():
        try:
            return await asyncio.gather(*[model.acomplete([{"role": "user", "content": f"Item{i} text"}])
                                          for i in range(8)])
        finally:
            await model.aclose()

    replies = asyncio.run(ask_all())
    assert fake_openai.max_inflight == 2
    assert all(f"Item{i}" in r for i, r in enumerate(replies))


@pytest.mark.integration
def test_ray_data_stage_end_to_end(local_ray, fake_openai):
    """`run` as the pipeline calls it: a Ray Dataset of requests in, contract rows out, through an actor
    pool of `concurrency` actors x `max_parallel_requests` threads (bounded in flight)."""
    import ray.data

    from qrag_ray.generation.backends.openai import run
    from qrag_ray.index.resource_plan import current_cluster, plan_generation

    fake_openai.delay_s = 0.05
    rows = [{"key": f"k{i}", "messages": [{"role": "user", "content": f"Subject{i} matters."}]} for i in range(12)]
    cfg = _cfg(fake_openai, concurrency=2, max_parallel_requests=2, batch_size=4)
    stage = plan_generation(cfg, current_cluster(local=True))
    assert stage.pool() == {"size": 2} and stage.batch_size == 4
    out = sorted(run(ray.data.from_items(rows), cfg, stage=stage).take_all(), key=lambda r: int(r["key"][1:]))
    assert [r["key"] for r in out] == [f"k{i}" for i in range(12)]
    assert all(f"Subject{i}" in r["raw"] for i, r in enumerate(out))
    assert all(r["prompt_tokens"] > 0 and r["output_tokens"] > 0 for r in out)
    assert fake_openai.chat_requests == 12 and fake_openai.model_requests == 1  # one driver preflight
    assert 1 <= fake_openai.max_inflight <= 4  # concurrency * max_parallel_requests


# ---- CLI: one line, no traceback -------------------------------------------------------------------------

def _cli_setup(tmp_path: Path, base_url: str) -> list[str]:
    (tmp_path / "docs.jsonl").write_text(json.dumps({"id": "d1", "text": "Berlin is the capital of Germany."}) + "\n")
    (tmp_path / "cfg.yaml").write_text(
        f"generator:\n  backend: openai\n  base_url: {base_url}\n  model: fake-model\n"
        f"  api_key_env: QRAG_TEST_OPENAI_KEY\nbuild:\n  cache_dir: {tmp_path / 'qcache'}\nchunker:\n  method: none\n")
    return ["index", "--input", str(tmp_path / "docs.jsonl"), "--output", str(tmp_path / "idx"),
            "--representation", "hype", "--generator", "openai", "--config", str(tmp_path / "cfg.yaml")]


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


@pytest.mark.integration  # the CLI in a subprocess (interpreter + Ray start-up)
def test_cli_401_one_line_no_traceback(fake_openai, tmp_path):
    """A real `qrag` process, as a user runs it."""
    fake_openai.require_key = "sk-right"
    env = {k: v for k, v in os.environ.items() if k not in ("QRAG_TEST_OPENAI_KEY", "RAY_ADDRESS")}
    env["QRAG_CACHE"] = str(tmp_path / "cache-root")
    process = subprocess.run([sys.executable, "-m", "qrag_ray.cli", *_cli_setup(tmp_path, fake_openai.base_url)],
                             capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert process.returncode == 2, process.stderr[-3000:]
    assert "Traceback" not in process.stderr, process.stderr[-3000:]
    errs = _error_lines(process.stderr)
    assert len(errs) == 1 and "HTTP 401" in errs[0] and "$QRAG_TEST_OPENAI_KEY" in errs[0], process.stderr[-3000:]
    assert not (tmp_path / "idx").exists()  # nothing half-written where a reader would look
    assert fake_openai.chat_requests == 0  # the driver preflight failed before any work was scheduled


@pytest.mark.integration
def test_cli_connection_refused_one_line(local_ray, closed_port_url, tmp_path, capsys):
    from qrag_ray.cli import main

    code = main(_cli_setup(tmp_path, closed_port_url))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    errs = _error_lines(err)
    assert len(errs) == 1 and "cannot connect to the OpenAI-compatible endpoint" in errs[0], err
    assert not (tmp_path / "idx").exists()


@pytest.mark.integration
def test_cli_error_raised_inside_a_ray_actor_is_one_line(local_ray, fake_openai, tmp_path, capsys):
    """A 400 on a chat request happens inside the actor pool; Ray wraps it, the CLI unwraps it."""
    from qrag_ray.cli import main

    fake_openai.fail_next(400)
    code = main(_cli_setup(tmp_path, fake_openai.base_url))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-3000:]
    errs = _error_lines(err)
    assert len(errs) == 1 and "HTTP 400: scripted failure 400" in errs[0], err[-3000:]


@pytest.mark.integration
@pytest.mark.timeout(300)  # what this guards against is a build that waits forever
def test_a_build_after_one_that_failed_inside_an_actor_runs(local_ray, fake_openai, tmp_path, capsys):
    """The user fixes what failed and builds again in the same process (a notebook, `qrag suite`): the failed
    build's Ray Data actors, which Ray Data leaves to Python's cyclic GC, may still hold part of a CPU: the next
    build's FAISS tasks do not wait for the whole machine."""
    from qrag_ray.cli import main

    fake_openai.fail_next(400)
    assert main(_cli_setup(tmp_path, fake_openai.base_url)) == 2
    assert main(_cli_setup(tmp_path, fake_openai.base_url)) == 0, capsys.readouterr().err[-3000:]
    assert (tmp_path / "idx" / "manifest.json").is_file()
