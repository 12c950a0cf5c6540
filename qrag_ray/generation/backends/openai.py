"""OpenAI-compatible backend: any `/chat/completions` endpoint, as docs/ARCHITECTURE.md ("Generator
backends") describes: bounded requests in flight, retries with backoff on 429/5xx/timeouts, one-line
errors otherwise, the endpoint checked on the driver first. `OpenAIChatClient` is shared with the online
`ChatModel` (generation/chat.py). `sampling.n > 1`: the n choices' texts are joined with "\n" into `raw`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from qrag_ray.config.llm import GeneratorConfig
from qrag_ray.errors import QragError
from qrag_ray.runtime.stage_plan import StagePlan

logger = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


def _retryable_errors() -> tuple[type[Exception], ...]:
    """Transport errors worth another attempt (httpx imported lazily: the module loads without it)."""
    import httpx

    return httpx.ConnectError, httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError


def _api_key(cfg: GeneratorConfig) -> str | None:
    return os.environ.get(cfg.api_key_env) if cfg.api_key_env else None


def _http_kwargs(cfg: GeneratorConfig) -> dict[str, Any]:
    """Headers, timeout and connection limits shared by the sync and async httpx clients."""
    import httpx

    key = _api_key(cfg)
    return {"headers": {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})},
            "timeout": cfg.request_timeout_s,
            "limits": httpx.Limits(max_connections=max(4, cfg.max_parallel_requests * 2))}


def _base_url(cfg: GeneratorConfig) -> str:
    if not cfg.base_url:
        raise QragError("generator.backend=openai needs generator.base_url (e.g. http://localhost:8000/v1)")
    return cfg.base_url.rstrip("/")


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _error_message(resp) -> str:
    with contextlib.suppress(Exception):  # the body is not JSON
        data = resp.json()
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            return _short(err.get("message") or err)
        if err or (isinstance(data, dict) and data.get("detail")):
            return _short(err or data["detail"])
    return _short(resp.text or resp.reason_phrase or "")


class OpenAIChatClient:
    """`/chat/completions` with retries; sync (`chat`) and async (`achat`) entry points.

    `chat`/`achat` return `{"texts": [str, ...], "prompt_tokens": int, "output_tokens": int,
    "finish_reasons": [...]}`. Errors a user can fix raise `QragError`.
    """

    def __init__(self, cfg: GeneratorConfig, *, max_retries: int = 6, backoff_base_s: float = 0.5,
                 backoff_max_s: float = 30.0):
        self.cfg = cfg
        self.base_url = _base_url(cfg)
        self.url = self.base_url + "/chat/completions"
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._client = None
        self._aclients: dict[int, Any] = {}  # one AsyncClient per event loop

    def body(self, messages: list[dict], *, max_tokens: int | None = None, temperature: float | None = None,
             n: int | None = None, seed_offset: int = 0) -> dict[str, Any]:
        sampling = self.cfg.sampling
        n = int(n if n is not None else sampling.n)
        return {"model": self.cfg.model,
                "messages": [{"role": str(m["role"]), "content": str(m["content"])} for m in messages],
                "max_tokens": int(max_tokens if max_tokens is not None else sampling.max_tokens),
                "temperature": float(temperature if temperature is not None else sampling.temperature),
                "top_p": float(sampling.top_p), "seed": int(sampling.seed) + int(seed_offset),
                **({"n": n} if n > 1 else {}), **(self.cfg.engine_kwargs or {})}

    @staticmethod
    def parse_response(data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise QragError(f"the OpenAI-compatible endpoint returned an unexpected body: {_short(data)}")
        texts = []
        reasons = []
        for choice in sorted(data["choices"], key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0):
            content = (choice.get("message") or {}).get("content")
            if content is None:  # legacy completions shape
                content = choice.get("text")
            texts.append(str(content or ""))
            reasons.append(choice.get("finish_reason"))
        usage = data.get("usage") or {}
        return {"texts": texts, "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                "output_tokens": int(usage.get("completion_tokens") or 0), "finish_reasons": reasons}

    def _fail(self, resp) -> QragError:
        code = resp.status_code
        msg = _error_message(resp)
        if code in (401, 403):
            key_state = "is set" if _api_key(self.cfg) else "is NOT set"
            return QragError(
                f"the endpoint {self.base_url} rejected the request with HTTP {code} ({msg}): check the API key "
                f"in ${self.cfg.api_key_env} (it {key_state})")
        if code == 404:
            return QragError(f"HTTP 404 from {self.url} ({msg}): check generator.base_url (it usually ends in /v1) "
                             f"and generator.model ('{self.cfg.model}')")
        return QragError(f"the endpoint {self.url} refused the request with HTTP {code}: {msg}")

    def _delay(self, attempt: int, resp=None) -> float:
        with contextlib.suppress(AttributeError, KeyError, ValueError):  # no response or no usable Retry-After
            return min(max(0.0, float(resp.headers["retry-after"])), self.backoff_max_s)
        delay = min(self.backoff_max_s, self.backoff_base_s * (2 ** attempt))
        return delay * (0.5 + random.random() / 2)

    def _give_up(self, what: str) -> QragError:
        return QragError(f"the endpoint {self.url} kept failing after {self.max_retries + 1} attempts ({what})")

    @staticmethod
    def _unreachable(base: str, error: Exception) -> QragError:
        return QragError(f"cannot connect to the OpenAI-compatible endpoint {base}: {type(error).__name__}: "
                         f"{_short(error)} (is the server running and generator.base_url right?)")

    @property
    def client(self):
        if self._client is None:
            import httpx

            self._client = httpx.Client(**_http_kwargs(self.cfg))
        return self._client

    def _judge(self, attempt: int, resp=None, exc: Exception | None = None) -> tuple[dict | None, str]:
        """One attempt's outcome, shared by the sync and async loops so they cannot drift apart:
        (parsed reply, "") on success, (None, why) when it is worth retrying; raises otherwise."""
        import httpx

        if exc is not None:
            # refused / DNS: retry briefly, then say so
            if isinstance(exc, httpx.ConnectError) and attempt >= min(2, self.max_retries):
                raise self._unreachable(self.base_url, exc) from None
            return None, f"{type(exc).__name__}: {_short(exc)}"
        if resp.status_code < 300:
            return self.parse_response(resp.json()), ""
        if resp.status_code not in RETRY_STATUS:
            raise self._fail(resp)
        return None, f"HTTP {resp.status_code}: {_error_message(resp)}"

    def chat(self, messages: list[dict], **options) -> dict[str, Any]:
        body = self.body(messages, **options)
        last = ""
        for attempt in range(self.max_retries + 1):
            resp = None
            exc = None
            try:
                resp = self.client.post(self.url, json=body)
            except _retryable_errors() as error:
                exc = error
            reply, last = self._judge(attempt, resp, exc)
            if reply is not None:
                return reply
            if attempt < self.max_retries:
                delay = self._delay(attempt, resp)
                logger.info("openai backend: %s; retry %d/%d in %.1fs", last, attempt + 1, self.max_retries, delay)
                time.sleep(delay)
        raise self._give_up(last)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _aclient(self):
        import httpx

        loop = id(asyncio.get_running_loop())
        if loop not in self._aclients or self._aclients[loop].is_closed:
            self._aclients[loop] = httpx.AsyncClient(**_http_kwargs(self.cfg))
        return self._aclients[loop]

    async def achat(self, messages: list[dict], **options) -> dict[str, Any]:
        body = self.body(messages, **options)
        client = self._aclient()
        last = ""
        for attempt in range(self.max_retries + 1):
            resp = None
            exc = None
            try:
                resp = await client.post(self.url, json=body)
            except _retryable_errors() as error:
                exc = error
            reply, last = self._judge(attempt, resp, exc)
            if reply is not None:
                return reply
            if attempt < self.max_retries:
                await asyncio.sleep(self._delay(attempt, resp))
        raise self._give_up(last)

    async def aclose(self) -> None:
        for client in list(self._aclients.values()):
            await client.aclose()
        self._aclients.clear()


def preflight(cfg: GeneratorConfig, timeout_s: float = 10.0) -> None:
    """Fail fast on the driver: the endpoint must answer and accept the key (`GET {base_url}/models`).
    A server without `/models` (404/405) passes; only connection errors and 401/403 raise."""
    import httpx

    base = _base_url(cfg)
    try:
        resp = httpx.get(base + "/models", headers=_http_kwargs(cfg)["headers"], timeout=timeout_s)
    except httpx.TimeoutException:
        logger.warning("openai backend: %s/models did not answer within %.0fs; going on", base, timeout_s)
        return
    except httpx.HTTPError as error:
        raise OpenAIChatClient._unreachable(base, error) from None
    if resp.status_code in (401, 403):
        raise OpenAIChatClient(cfg)._fail(resp)


# ------------------------------------------------------------------------------------ Ray Data stage
class _OpenAIStage:
    """Actor: sends the requests of a batch concurrently (thread pool), returns contract columns."""

    def __init__(self, cfg_json: str):
        self.cfg = GeneratorConfig.model_validate_json(cfg_json)
        self.client = OpenAIChatClient(self.cfg)
        self.pool = ThreadPoolExecutor(max_workers=self.cfg.max_parallel_requests)

    def _one(self, messages) -> tuple[str, int, int]:
        reply = self.client.chat(list(messages.tolist() if hasattr(messages, "tolist") else messages))
        return "\n".join(reply["texts"]), reply["prompt_tokens"], reply["output_tokens"]

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        results = list(self.pool.map(self._one, list(batch["messages"])))
        return {"key": np.asarray([str(k) for k in batch["key"]], dtype=object),
                "raw": np.asarray([r[0] for r in results], dtype=object),
                "prompt_tokens": np.asarray([r[1] for r in results], dtype=np.int64),
                "output_tokens": np.asarray([r[2] for r in results], dtype=np.int64)}

    def __del__(self):  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.pool.shutdown(wait=False)
            self.client.close()


def run(dataset, cfg: GeneratorConfig, model_path: str | None = None, *, stage: StagePlan, check: bool = True):
    """Raw outputs for every request row of `dataset` through the endpoint (lazy Ray Dataset out), on the client
    actors of `stage` (the build's resource plan). `model_path` is ignored (the endpoint serves `cfg.model`);
    `check=False` skips the driver preflight."""
    import ray.data

    if check:
        preflight(cfg)
    return dataset.select_columns(["key", "messages"]).map_batches(
        _OpenAIStage, fn_constructor_kwargs={"cfg_json": cfg.model_dump_json()}, batch_format="numpy",
        batch_size=stage.batch_size, compute=ray.data.ActorPoolStrategy(**stage.pool()), num_cpus=stage.num_cpus)
