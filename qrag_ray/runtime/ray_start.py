"""Starting or joining Ray the same way for every entry point: Ray Data's error and progress settings, quiet
logs at the default verbosity, and Ray's token authentication on by default, for a local Ray and for a
cluster joined by address (docs/CLUSTER.md, "Who can reach what")."""

from __future__ import annotations

import json
import os
import sys

from qrag_ray.errors import QragError, exception_chain

# What every Ray process of a qrag run needs in its environment: no model hub (the weights are local), and
# tokenizers that do not fork a thread pool inside Ray's worker processes.
PROCESS_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# Ray hands a submitted job's config (its runtime env included) to the entrypoint in this variable.
JOB_CONFIG_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def job_runtime_env() -> dict | None:
    """The runtime env of the Ray job this driver runs in (`ray job submit`, a KubeRay RayJob), else None."""
    raw = os.environ.get(JOB_CONFIG_VAR)
    return (json.loads(raw).get("runtime_env") or None) if raw else None


def driver_runtime_env(job_env: dict | None) -> dict:
    """Pure: the runtime env this driver gives ray.init. Inside a job Ray merges it into the job's own and refuses
    any variable both set ("Failed to merge the Job's runtime env"), so a variable the job sets is left to the job:
    the job's value wins, and every other variable the job sets (a user's own) reaches the workers through
    Ray's merge."""
    taken = ((job_env or {}).get("env_vars") or {}).keys()
    own = {k: v for k, v in PROCESS_ENV.items() if k not in taken}
    return {"env_vars": own} if own else {}


# The fewest logical CPUs of a Ray started in-process: what the stream holds at once on a small machine (a
# read task, chunking, row building, the embedding actor: 3) and one over, so no stage waits for a slot
# another one holds while it is blocked.
LOCAL_MIN_CPUS = 4


def local_num_cpus(vllm_on_cpu: bool = True, cores: int | None = None) -> int:
    """Logical CPUs of a Ray started in-process: the machine's `cores` (default os.cpu_count()), LOCAL_MIN_CPUS at
    least, and four times as many (8 at least) only where vLLM runs on CPU (the engine actor holds a whole CPU
    slot while it mostly waits and the light stages take fractions; with as many slots as a laptop's 2 cores
    the light stages take them all and the engine never schedules). The caller decides."""
    cores = cores or os.cpu_count() or 1
    return max(8, 4 * cores) if vllm_on_cpu else max(LOCAL_MIN_CPUS, cores)


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
    except Exception as error:  # only an authentication failure is translated
        if not refused_for_auth(error):
            raise
        raise QragError(auth_refused_message(address, mode)) from None


def refused_for_auth(exc: BaseException) -> bool:
    """Pure: whether Ray's exception (or one in its cause chain) is an authentication failure: Ray raises
    AuthenticationError when no token is found here; a token the cluster rejects comes back as a
    ConnectionError caused by a RuntimeError carrying the GCS's InvalidAuthToken status as text."""
    from ray.exceptions import AuthenticationError

    return any(isinstance(e, AuthenticationError) or "InvalidAuthToken" in str(e) for e in exception_chain(exc))


def ensure_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool | None = None) -> None:
    """Join a cluster when an address is given (or RAY_ADDRESS is set), else start Ray in-process with
    `num_cpus` logical CPUs (None: `local_num_cpus()`, the count vLLM on CPU needs). Every entry point starts
    or joins Ray here."""
    import ray
    import ray.data

    from qrag_ray.runtime import logs
    from qrag_ray.runtime.progress_ray import attach_ray_data

    ctx = ray.data.DataContext.get_current()
    # A QragError raised in a map UDF (bad record, line N) must reach the CLI as itself: Ray Data's
    # default UserCodeException wrapper loses the cause, which would turn one clear line into a traceback.
    ctx.raise_original_map_exception = True
    # Parquet through Ray Data's V1 reader: 2.60's V2 (`ListFiles -> ReadFiles`) spends seconds listing even one
    # local file (its listing task mostly sleeps), and every build with generation reads the question cache
    # twice, a Parquet corpus once (docs/BENCHMARKS.md, "Index builds")
    ctx.use_datasource_v2 = False
    quiet = logs.verbosity() == 0 if quiet is None else quiet
    logs.quiet_ray_data()
    attach_ray_data(ctx)  # our stage display reads Ray Data's operators; its own bars stay off
    if ray.is_initialized():
        return
    kwargs = dict(runtime_env=driver_runtime_env(job_runtime_env()), logging_level="ERROR" if quiet else "INFO",
                  log_to_driver=not quiet)
    if address := address or os.environ.get("RAY_ADDRESS"):
        return join_ray(address, **kwargs)
    client_auth_mode()
    # address="local": a new in-process Ray, never one that `ray start` happened to leave in
    # /tmp/ray on this machine (ray.init(None) would join it and then reject num_cpus).
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=num_cpus or local_num_cpus(), include_dashboard=False, **kwargs)
            return
        except Exception as error:  # Ray raises a bare Exception for this
            # Ray gives a new raylet a fixed 30 s to register; on a busy 2-core machine that is not
            # always enough, and a retry usually is.
            if "timed out during startup" not in str(error) or attempt == 2:
                raise
            ray.shutdown()
