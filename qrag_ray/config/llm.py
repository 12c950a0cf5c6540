"""LLM settings: the query-time LLM that `qrag serve` calls (LLMConfig) and index-time question
generation (GeneratorConfig, which adds prompts, question counts and Ray Data batching to it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from qrag_ray.config.roles import Strict, field_roles


class QuerySamplingConfig(Strict):
    """Decoding settings of a query-time LLM call (each call sets its own temperature and max_tokens)."""

    top_p: float = 1.0
    repetition_penalty: float = 1.1
    seed: int = 0


class SamplingConfig(QuerySamplingConfig):
    """Index-time decoding settings; part of the question-cache key."""

    temperature: float = 0.0
    max_tokens: int = Field(256, ge=1)
    n: int = Field(1, ge=1, description="candidates sampled per prompt")


# how this run reaches the LLM, not what it answers: the question cache does not key on these
@field_roles(run=("num_gpus", "engine_kwargs", "base_url", "api_key_env", "request_timeout_s", "max_parallel_requests"))
class LLMConfig(Strict):
    """An LLM to call (an OpenAI-compatible endpoint or an in-process vLLM engine) and how it decodes:
    what `qrag serve` takes for mode=hyde and /v1/answer."""

    backend: Literal["openai", "vllm"]
    model: str = "qwen2.5-coder-0.5b-instruct"  # a registry name (qrag_ray.models) or a local HF folder
    sampling: QuerySamplingConfig = QuerySamplingConfig()
    # vLLM engine: the GPUs of ONE engine (0 = vLLM's CPU build); above 1 its tensor-parallel workers, one GPU
    # each (engine_kwargs.tensor_parallel_size defaults to it); below 1 engines share a GPU
    num_gpus: float = 0.0
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # OpenAI-compatible endpoint
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    request_timeout_s: float = 120.0
    max_parallel_requests: int = Field(8, ge=1)

    def check_endpoint(self) -> None:
        """For the validators of the configs that hold one: the chat client would report it only when used."""
        if self.backend == "openai" and not self.base_url:
            raise ValueError("generator.backend=openai needs generator.base_url")


@field_roles(run=("batch_size", "concurrency"))
class GeneratorConfig(LLMConfig):
    """Where questions come from. `granularity` decides whether one prompt covers a chunk or an atom."""

    backend: Literal["vllm", "openai", "precomputed", "none"] = "none"
    sampling: SamplingConfig = SamplingConfig()
    prompt: str = "hype"  # chunk-granularity template (qrag_ray.generation.prompts)
    # atom granularity: one prompt per atom with the chunk as context; the default (two worked examples)
    # suits the small offline generator best
    atom_prompt: str = "atom-question-fewshot"
    atomize_prompt: str = "atomize"  # unstructured atoms: LLM-written atomic statements
    questions: int | None = Field(10, ge=1, description="questions per chunk prompt; None = the LLM decides")
    questions_per_atom: int | None = Field(3, ge=1)
    granularity: Literal["chunk", "atom"] | None = None  # None: the representation's default
    atoms: Literal["sentence", "llm"] = "sentence"  # structured (sentences) or unstructured (LLM) atoms
    precomputed_column: str = "questions"
    # Ray Data LLM processor: rows per engine call, and engines (or OpenAI client actors), all started before
    # the first request; None: vLLM, one engine per num_gpus GPUs of the cluster (1 on CPU); openai, 1
    batch_size: int = Field(16, ge=1)
    concurrency: int | None = Field(None, ge=1)
