"""The processes of one local cluster, found by what `ray start` gave them (cluster/local_cluster.py): the
environment marker QRAG_LOCAL_CLUSTER=<dir> or the cluster's temp dir on the command line. Teardown
signals exactly those, never every Ray process of the user (other people's clusters run on the box too)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ENV_MARKER = "QRAG_LOCAL_CLUSTER"


def read_environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def read_cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def cluster_pids(cdir: Path) -> list[int]:
    """Processes that belong to the cluster in cdir: they carry the env marker or the temp dir."""
    marker = f"{ENV_MARKER}={cdir}\0".encode()
    tdir = str(cdir / "ray").encode()
    own_pid = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == own_pid:
            continue
        env = read_environ(pid)
        if marker in env + b"\0" or tdir in read_cmdline(pid):
            # skip zombies: they hold no resources and vanish when reaped
            try:
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            except (OSError, IndexError):
                continue
            out.append(pid)
    return sorted(out)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass


def kill_cluster_processes(cdir: Path, grace_s: float = 10.0) -> list[int]:
    """SIGTERM the cluster's processes, SIGKILL what is left after grace_s; returns survivors."""
    pids = cluster_pids(cdir)
    if not pids:
        return []
    _signal_all(pids, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline:
        left = cluster_pids(cdir)
        if not left:
            return []
        time.sleep(0.3)
    # processes spawned during shutdown (e.g. a worker started just now) are caught here too
    for _ in range(5):
        left = cluster_pids(cdir)
        if not left:
            return []
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.5)
    return cluster_pids(cdir)
