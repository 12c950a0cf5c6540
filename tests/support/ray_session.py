"""The one local Ray every test starts: `qrag_ray.runtime.ray_start.ensure_ray` (what `qrag index` and `qrag serve`
start), with Serve's process settings in the environment first, so the serving tests run the request
path that `qrag serve` and the manifests run whichever test happens to start Ray."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def local_ray_session() -> Iterator[dict]:
    import ray

    from qrag_ray.runtime.ray_start import ensure_ray
    from qrag_ray.serving.config import SERVE_PROCESS_ENV

    started = not ray.is_initialized()
    if started:
        # Ray reads these when each of its processes starts: they must be set before it does
        for var, val in SERVE_PROCESS_ENV.items():
            os.environ.setdefault(var, val)
        # a loaded 2-core box can take longer than Serve's 5 s proxy readiness default
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
        os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
        ensure_ray(None, 8)  # logical CPUs above the cores: vLLM-CPU's engine needs a slot of its own
    node = next(n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ray.util.get_node_ip_address())
    try:
        yield {"metrics_port": int(node["MetricsExportPort"])}
    finally:
        if started:
            ray.shutdown()
