"""What the cluster tests check on a running local cluster's processes."""

from __future__ import annotations

from pathlib import Path

from cluster import local_cluster as lc

# Ray's Python processes overwrite /proc/PID/environ with their process title, so only the native
# binaries' environments can be read back; they are the processes that enforce the token.
NATIVE = ("gcs_server", "raylet")


def native_processes_in_token_mode(cdir: Path) -> dict[str, int]:
    """Each GCS and raylet of the cluster in cdir, by name, with how many run with RAY_AUTH_MODE=token;
    raises AssertionError naming the first one that does not."""
    counts: dict[str, int] = {}
    for pid in lc.cluster_pids(cdir):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # exited between the listing and the read
            continue
        name = next((n for n in NATIVE if f"/{n}\0".encode() in cmd), None)
        if name:
            assert b"RAY_AUTH_MODE=token" in env, (name, pid)
            counts[name] = counts.get(name, 0) + 1
    return counts
