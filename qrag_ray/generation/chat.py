"""Online chat completions for query time (HyDE, answer synthesis) over the same backends as indexing.

`get_chat_model(cfg.generator)` gives a `ChatModel`: `await model.acomplete(messages, max_tokens=,
temperature=)` or, outside an event loop, `model.complete(...)`. `VLLMChatModel` starts slowly on CPU,
so a replica calls `start()` in its constructor; `close()` frees the engine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from typing import Protocol, runtime_checkable

from qrag_ray.config.llm import GeneratorConfig
from qrag_ray.errors import QragError
from qrag_ray.generation.backends.openai import OpenAIChatClient
from qrag_ray.generation.backends.vllm import check_model_path, cpu_env_vars, engine_kwargs_for, per_request_seed_ok

logger = logging.getLogger(__name__)

Messages = list[dict]


@runtime_checkable
class ChatModel(Protocol):
    async def acomplete(self, messages: Messages, *, max_tokens: int = 256, temperature: float = 0.0) -> str: ...

    def complete(self, messages: Messages, *, max_tokens: int = 256, temperature: float = 0.0) -> str: ...


def _checked(messages: Messages, max_tokens: int, temperature: float) -> list[dict[str, str]]:
    """The messages as {role, content} string dicts, once they and then the sampling arguments pass the checks."""
    if hasattr(messages, "tolist"):
        messages = messages.tolist()
    if not isinstance(messages, (list, tuple)) or not messages:
        raise QragError("chat messages must be a non-empty list of {role, content} dicts")
    if bad := [m for m in messages if not isinstance(m, dict) or "role" not in m or "content" not in m]:
        raise QragError(f"bad chat message {bad[0]!r}: expected a dict with 'role' and 'content'")
    if int(max_tokens) < 1:
        raise QragError(f"max_tokens must be >= 1, got {max_tokens}")
    if float(temperature) < 0:
        raise QragError(f"temperature must be >= 0, got {temperature}")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]


class OpenAIChatModel:
    """Chat over an OpenAI-compatible endpoint (`cfg.base_url`, model `cfg.model`)."""

    def __init__(self, cfg: GeneratorConfig):
        self.cfg = cfg
        self.client = OpenAIChatClient(cfg)
        self._sems: dict[int, asyncio.Semaphore] = {}

    async def acomplete(self, messages: Messages, *, max_tokens: int = 256, temperature: float = 0.0) -> str:
        msgs = _checked(messages, max_tokens, temperature)
        loop = id(asyncio.get_running_loop())  # one semaphore per event loop: a model serves several
        async with self._sems.setdefault(loop, asyncio.Semaphore(self.cfg.max_parallel_requests)):
            reply = await self.client.achat(msgs, max_tokens=max_tokens, temperature=temperature, n=1)
        return reply["texts"][0] if reply["texts"] else ""

    def complete(self, messages: Messages, *, max_tokens: int = 256, temperature: float = 0.0) -> str:
        msgs = _checked(messages, max_tokens, temperature)
        reply = self.client.chat(msgs, max_tokens=max_tokens, temperature=temperature, n=1)
        return reply["texts"][0] if reply["texts"] else ""

    async def aclose(self) -> None:
        await self.client.aclose()
        self.client.close()

    def close(self) -> None:
        self.client.close()


class VLLMChatModel:
    """In-process vLLM AsyncLLM engine on a private event-loop thread."""

    def __init__(self, cfg: GeneratorConfig, model_path: str | None = None):
        self.cfg = cfg
        if model_path is None:
            from qrag_ray.models.bundled import resolve_llm

            model_path = resolve_llm(cfg.model)
        self.model_path = check_model_path(model_path)
        self._engine = self._tokenizer = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _engine_args(self):
        from vllm.engine.arg_utils import AsyncEngineArgs

        engine_kwargs = engine_kwargs_for(self.cfg)
        engine_kwargs.pop("task_type", None)
        engine_kwargs.setdefault("disable_log_stats", True)
        if self.cfg.num_gpus <= 0:  # sampled calls on CPU carry no seed of their own (per_request_seed_ok)
            engine_kwargs.setdefault("seed", int(self.cfg.sampling.seed))
        return AsyncEngineArgs(model=self.model_path, **engine_kwargs)

    def start(self) -> "VLLMChatModel":
        """Start the engine now (blocking). Idempotent; `acomplete` calls it lazily."""
        with self._lock:
            if self._engine is not None:
                return self
            if self.cfg.num_gpus <= 0:
                for variable, setting in cpu_env_vars().items():
                    os.environ.setdefault(variable, setting)
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name="qrag-vllm-chat", daemon=True)
            thread.start()
            ready.wait()

            async def build():
                from vllm.v1.engine.async_llm import AsyncLLM

                return AsyncLLM.from_engine_args(self._engine_args())

            try:
                engine = asyncio.run_coroutine_threadsafe(build(), loop).result()
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=5)
                raise
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
            self._engine = engine
            self._loop = loop
            self._thread = thread
            logger.info("vLLM chat engine ready: %s", self.model_path)
        return self

    def close(self) -> None:
        """Shut the engine down and stop its thread (idempotent)."""
        with self._lock:
            engine = self._engine
            loop = self._loop
            thread = self._thread
            self._engine = self._loop = self._thread = None
        if engine is not None:
            try:
                engine.shutdown()
            except Exception as error:
                logger.warning("vLLM engine shutdown: %s", error)
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=10)

    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # a dict or BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def _sampling(self, max_tokens: int, temperature: float):
        from vllm import SamplingParams

        sampling = self.cfg.sampling
        seed = int(sampling.seed) if per_request_seed_ok(self.cfg.num_gpus, temperature) else None
        return SamplingParams(max_tokens=int(max_tokens), temperature=float(temperature), top_p=float(sampling.top_p),
                              repetition_penalty=float(sampling.repetition_penalty), seed=seed, n=1)

    async def _generate(self, ids: list[int], params) -> str:
        final = None
        async for output in self._engine.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex):
            final = output
        return final.outputs[0].text if final is not None and final.outputs else ""

    def _submit(self, messages: Messages, max_tokens: int, temperature: float):
        msgs = _checked(messages, max_tokens, temperature)
        self.start()
        job = self._generate(self._prompt_ids(msgs), self._sampling(max_tokens, temperature))
        return asyncio.run_coroutine_threadsafe(job, self._loop)

    async def acomplete(self, messages: Messages, *, max_tokens: int = 256, temperature: float = 0.0) -> str:
        if self._engine is None:  # first call: start without blocking the caller's loop
            await asyncio.get_running_loop().run_in_executor(None, self.start)
        return await asyncio.wrap_future(self._submit(messages, max_tokens, temperature))

    def complete(self, messages: Messages, *, max_tokens: int = 256, temperature: float = 0.0) -> str:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no running loop: blocking is fine
            return self._submit(messages, max_tokens, temperature).result()
        raise RuntimeError("VLLMChatModel.complete() blocks; inside an event loop use "
                           "`await VLLMChatModel.acomplete(...)`")


def get_chat_model(cfg: GeneratorConfig, model_path: str | None = None) -> ChatModel:
    """The online chat model for `cfg.backend`; `model_path` (vllm only) overrides resolving `cfg.model`."""
    if isinstance(cfg, dict):
        cfg = GeneratorConfig.model_validate(cfg)
    if cfg.backend == "openai":
        return OpenAIChatModel(cfg)
    if cfg.backend == "vllm":
        return VLLMChatModel(cfg, model_path)
    raise QragError(f"no chat model for generator.backend='{cfg.backend}': use 'openai' (with base_url) or 'vllm'")
