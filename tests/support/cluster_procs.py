"""What the cluster tests check on a running local cluster's processes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cluster import node_processes as procs

# Ray's Python processes overwrite /proc/PID/environ with their process title, so only the native
# binaries' environments can be read back; they are the processes that enforce the token.
NATIVE = ("gcs_server", "raylet")


def native_processes_in_token_mode(cdir: Path) -> Counter[str]:
    """How many GCS and raylet processes the cluster in cdir runs, by name; raises AssertionError
    naming the first one not in token mode."""
    counts: Counter[str] = Counter()
    for pid in procs.cluster_pids(cdir):
        cmd = procs.read_cmdline(pid)
        env = procs.read_environ(pid)
        name = next((n for n in NATIVE if f"/{n}\0".encode() in cmd), None)
        if name and env:  # both are empty once a process has exited: skipped
            assert b"RAY_AUTH_MODE=token" in env.split(b"\0"), (name, pid)
            counts[name] += 1
    return counts
