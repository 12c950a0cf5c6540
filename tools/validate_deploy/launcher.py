"""The Ray cluster-launcher config (cluster/cloud-gpu.yaml): Ray's own validate_config, the node shape
the plan needs, and token authentication on every node with the dashboard kept on the head's loopback."""

from __future__ import annotations

import copy
import re
from typing import Any

TOKEN_PATH = "~/.ray/auth_token"


def check_cluster_launcher(cfg: Any) -> list[str]:
    """Ray's validate_config (jsonschema against ray/autoscaler/ray-schema.json + its own checks),
    plus the shape the plan needs: a CPU-only head, a GPU worker type, a CPU worker type."""
    import jsonschema
    from ray.autoscaler._private.util import validate_config

    try:
        validate_config(copy.deepcopy(cfg))
    except (jsonschema.ValidationError, ValueError, RuntimeError) as error:
        return [f"Ray cluster-launcher schema: {getattr(error, 'message', error)}"]
    out = []
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    if head.get("resources", {}).get("CPU", None) != 0 or head.get("resources", {}).get("GPU", 0):
        out.append("head node type must be CPU-only with CPU: 0 (no work on the head)")
    workers = {k: v for k, v in types.items() if k != cfg["head_node_type"]}
    if not any(v.get("resources", {}).get("GPU", 0) >= 1 for v in workers.values()):
        out.append("no GPU worker type")
    if not any(not v.get("resources", {}).get("GPU", 0) and v.get("resources", {}).get("CPU", 0) >= 1
               for v in workers.values()):
        out.append("no CPU worker type")
    for name, node_type in workers.items():
        if "max_workers" not in node_type or node_type.get("min_workers", 0) > node_type["max_workers"]:
            out.append(f"worker type {name}: autoscaling bounds need min_workers <= max_workers")
    return out + check_launcher_auth(cfg)


def check_launcher_auth(cfg: dict) -> list[str]:
    """Every `ray start` runs with RAY_AUTH_MODE=token, the token reaches every node (file_mounts to
    Ray's default token path), and the head's dashboard is not bound to a public address (it is
    reached through `ray dashboard`'s SSH tunnel)."""
    out = []
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in cfg.get(key) or [] if re.search(r"\bray start\b", c)]
        if not starts:
            out.append(f"{key}: no `ray start`")
        for command in starts:
            if not re.search(r"\bRAY_AUTH_MODE=token\s+(\S+=\S*\s+)*ray start\b", command):
                out.append(f"{key}: `ray start` without RAY_AUTH_MODE=token: {command!r}")
            match = re.search(r"--dashboard-host[= ](\S+)", command)
            if match and match.group(1) not in ("127.0.0.1", "localhost"):
                out.append(f"{key}: the dashboard listens on {match.group(1)} (keep it on loopback, use `ray "
                           "dashboard`)")
    if TOKEN_PATH not in (cfg.get("file_mounts") or {}):
        out.append(f"file_mounts: the token is not copied to {TOKEN_PATH} on the nodes")
    return out
