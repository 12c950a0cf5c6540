"""A cluster's nodes as its GCS sees them: the ALIVE ones, and a wait until enough have joined."""

from __future__ import annotations

import time


def live_nodes(address: str, timeout: float = 5.0) -> list[dict]:
    """ALIVE nodes according to the GCS: [{node_id, resources}]"""
    from ray._raylet import GcsClient

    from qrag_ray.runtime.ray_start import client_auth_mode

    client_auth_mode()  # the GCS of a token cluster answers only a client in token mode
    client = GcsClient(address=address)
    infos = client.get_all_node_info(timeout=timeout)
    out = []
    for nid, info in infos.items():
        if info.state != 0:  # GcsNodeInfo.ALIVE == 0
            continue
        out.append({"node_id": nid.hex(), "resources": dict(info.resources_total),
                    "is_head": bool(info.is_head_node), "port": info.node_manager_port})
    return out


def wait_for_nodes(address: str, count: int, timeout: float = 90.0) -> list[dict]:
    deadline = time.time() + timeout
    last: Exception | None = None
    while time.time() < deadline:
        try:
            nodes = live_nodes(address)
            if len(nodes) >= count:
                return nodes
        except Exception as error:  # the GCS may still be starting
            last = error
        time.sleep(1.0)
    raise RuntimeError(f"cluster at {address} did not reach {count} alive nodes in {timeout:.0f}s ({last})")
