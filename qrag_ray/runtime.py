"""Starting or joining Ray, once, the same way for every entry point (`qrag index`, `qrag eval`, the vLLM
backend run on its own, tests): Ray Data's error and progress settings, quiet logs at the default
verbosity, and an in-process Ray with more logical CPUs than cores (the vLLM-CPU engine, the tokenizer
stages and the embedder each hold a CPU slot; with 2 slots the engine would never schedule, see
qrag_ray/generation/backends/vllm.py)."""

from __future__ import annotations

import os


def ensure_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool | None = None) -> None:
    """Join a cluster when an address is given, else start Ray in-process.

    In-process Ray gets more logical CPUs than cores: the vLLM-CPU engine, the tokenizer stages and the
    embedder each hold a CPU slot, and with 2 slots the engine would never schedule (see
    qrag_ray/generation/backends/vllm.py).
    """
    import ray
    import ray.data

    ctx = ray.data.DataContext.get_current()
    # A QragError raised in a map UDF (bad record, line N) must reach the CLI as itself: Ray Data's
    # default UserCodeException wrapper loses the cause on the way back, which would turn one clear
    # line into a traceback.
    ctx.raise_original_map_exception = True
    from qrag_ray import logs

    quiet = logs.verbosity() == 0 if quiet is None else quiet
    logs.quiet_ray_data()
    try:  # our stage display reads Ray Data's operators; its own bars stay off
        from qrag_ray.progress_ray import attach_ray_data

        attach_ray_data(ctx)
    except ImportError:  # a Ray without execution callbacks: no operator rows, stages still show
        ctx.enable_progress_bars = os.environ.get("QRAG_PROGRESS") == "1"
        ctx.print_on_execution_start = False
    if ray.is_initialized():
        return
    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}
    kwargs = dict(runtime_env=env, logging_level="ERROR" if quiet else "INFO", log_to_driver=not quiet)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, **kwargs)
    else:
        # address="local": a new in-process Ray, never one that `ray start` happened to leave in
        # /tmp/ray on this machine (ray.init(None) would join it and then reject num_cpus).
        for attempt in range(3):
            try:
                ray.init(address="local", num_cpus=num_cpus or max(8, 4 * (os.cpu_count() or 2)),
                         include_dashboard=False, **kwargs)
                break
            except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
                # Ray gives a new raylet a fixed 30 s to register; on a 2-core laptop already busy
                # (an LLM engine, another Ray) that is not always enough, and a retry usually is.
                if "timed out during startup" not in str(e) or attempt == 2:
                    raise
                ray.shutdown()


# ---------------------------------------------------------------- pure row builders
