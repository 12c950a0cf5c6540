"""Starting or joining Ray the same way for every entry point: Ray Data's error and progress settings, quiet
logs at the default verbosity, and Ray's token authentication on by default, for a local Ray and for a
cluster joined by address (docs/CLUSTER.md, "Who can reach what")."""

from __future__ import annotations

import os
import sys

from qrag_ray.errors import QragError, exception_chain


def client_auth_mode() -> str:
    """Ray token authentication for this process and the Ray it starts or joins, unless the caller set
    RAY_AUTH_MODE: an unauthenticated Ray lets anyone who reaches its dashboard or GCS run code. Ray caches
    the mode in its config, refreshed here while no Ray runs in this process."""
    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "token"
        ray = sys.modules.get("ray")
        if ray is not None and not ray.is_initialized():
            from ray._raylet import Config

            Config.initialize("")
    return os.environ["RAY_AUTH_MODE"]


def auth_refused_message(address: str, mode: str) -> str:
    """Pure: the one line a user gets when a cluster refuses this client, saying what to set."""
    fix = ("set RAY_AUTH_TOKEN to the cluster's token, or RAY_AUTH_TOKEN_PATH to a file holding it "
           "(`ray get-auth-token` prints it on the head node)")
    if mode != "token":
        fix = f"this client has RAY_AUTH_MODE={mode}: unset it (or set it to token) and {fix}"
    return f"the Ray cluster at {address} requires its authentication token: {fix}"


def join_ray(address: str, **kwargs) -> None:
    """ray.init onto a running cluster in token mode; a refused token becomes one line saying what to set."""
    import ray

    mode = client_auth_mode()
    try:
        ray.init(address=address, **kwargs)
    except Exception as e:  # noqa: BLE001 - only an authentication failure is translated
        if not refused_for_auth(e):
            raise
        raise QragError(auth_refused_message(address, mode)) from None


def refused_for_auth(exc: BaseException) -> bool:
    """Pure: whether Ray's exception (or one in its cause chain) is an authentication failure: Ray raises
    AuthenticationError when no token is found here; a token the cluster rejects comes back as a
    ConnectionError caused by a RuntimeError carrying the GCS's InvalidAuthToken status as text."""
    from ray.exceptions import AuthenticationError

    return any(isinstance(e, AuthenticationError) or "InvalidAuthToken" in str(e) for e in exception_chain(exc))


def ensure_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool | None = None) -> None:
    """Join a cluster when an address is given, else start Ray in-process with more logical CPUs than
    cores: the vLLM-CPU engine, the tokenizer stages and the embedder each hold a CPU slot, and with 2
    slots the engine would never schedule."""
    import ray
    import ray.data

    from qrag_ray.runtime import logs
    from qrag_ray.runtime.progress_ray import attach_ray_data

    ctx = ray.data.DataContext.get_current()
    # A QragError raised in a map UDF (bad record, line N) must reach the CLI as itself: Ray Data's
    # default UserCodeException wrapper loses the cause, which would turn one clear line into a traceback.
    ctx.raise_original_map_exception = True
    quiet = logs.verbosity() == 0 if quiet is None else quiet
    logs.quiet_ray_data()
    attach_ray_data(ctx)  # our stage display reads Ray Data's operators; its own bars stay off
    if ray.is_initialized():
        return
    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}
    kwargs = dict(runtime_env=env, logging_level="ERROR" if quiet else "INFO", log_to_driver=not quiet)
    if address := address or os.environ.get("RAY_ADDRESS"):
        return join_ray(address, **kwargs)
    client_auth_mode()
    # address="local": a new in-process Ray, never one that `ray start` happened to leave in
    # /tmp/ray on this machine (ray.init(None) would join it and then reject num_cpus).
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=num_cpus or max(8, 4 * (os.cpu_count() or 2)),
                     include_dashboard=False, **kwargs)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            # Ray gives a new raylet a fixed 30 s to register; on a busy 2-core machine that is not
            # always enough, and a retry usually is.
            if "timed out during startup" not in str(e) or attempt == 2:
                raise
            ray.shutdown()
