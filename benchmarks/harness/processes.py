"""Where a benchmark's CPU and memory go, by process. CPU: the CPU seconds of this run's Ray processes (or
of any psutil processes) per process title, read before and after a block of requests, give each
process's CPU ms per request; the request path is the processes a request passes through. Memory: the
peak resident memory of a process and everything it started, by kind of process (MemoryWatch)."""

from __future__ import annotations

import os
import threading
import time


def ray_cpu_by_process() -> dict[str, float]:
    """CPU seconds so far per Ray process title (ray::ProxyActor, ray::ServeReplica:new:Router, ...) of this
    run's Ray: blocks alternate between the apps, so the delta over a block is that app's cost, the
    figure that survives a shared machine (wall-clock qps there measures the CPU share an app won);
    several processes of one title summed: where a request's CPU goes. A worker's title also names the
    method it runs at the moment (ray::ServeController.listen_for_change), which is dropped: otherwise
    a process whose method changed between two readings would count all its CPU since it started."""
    import psutil

    # this run's Ray only, not another user's on a shared machine: the processes this driver started (its
    # in-process Ray's raylet, GCS, workers and what they started), or those of the cluster started for it
    if tmp := os.environ.get("QRAG_BENCH_RAY_TEMP_DIR"):
        roots = [p for p in psutil.process_iter(["cmdline"]) if any(tmp in a for a in (p.info["cmdline"] or []))]
        procs = list({q.pid: q for r in roots for q in (r, *r.children(recursive=True))}.values())
    else:
        procs = psutil.Process().children(recursive=True)
    return cpu_by_title(procs)


def cpu_by_title(procs: list, every: bool = False) -> dict[str, float]:
    """CPU seconds so far per title of `procs` (psutil processes), several of one title summed: Ray's
    workers (`ray::...`, without the method they run) and Serve's HAProxy ingress, or with `every` each of
    them (another by its command's first word: a raylet, the GCS, an agent)."""
    import psutil

    out: dict[str, float] = {}
    for process in procs:
        try:
            cmd = " ".join(process.cmdline() or []) or process.name()
            if process.name() == "haproxy":  # Serve's HAProxy ingress, this run's own
                name = "haproxy"
            elif cmd.startswith("ray::") or every:
                name = cmd.split()[0].split(".")[0]
            else:
                continue
            times = process.cpu_times()
            out[name] = out.get(name, 0.0) + times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


INGRESS = ("ray::ProxyActor", "ray::HAProxyManager", "haproxy")


def ingress_cpu(by_process: dict[str, float]) -> float:
    """The share of `by_process` that Serve's proxy or HAProxy ingress used (HAProxy and its manager
    actor, which reads the line HAProxy writes per request for Serve's metrics)."""
    return sum(v for n, v in by_process.items() if n.startswith(INGRESS))


def request_path_cpu(by_process: dict[str, float], app: str | None = None) -> float:
    """CPU ms per request of the processes a request passes through (`app`'s replicas, else every app's,
    and the ingress): the controller, dashboard agent and idle workers cost CPU per second whatever the
    load, so dividing theirs by the requests of an interval says more about its length than about a
    request."""
    replicas = f"ray::ServeReplica:{app}:" if app else "ray::ServeReplica"
    return sum(v for n, v in by_process.items() if n.startswith(replicas)) + ingress_cpu(by_process)


def cpu_by_process(before: dict, after: dict, requests: int) -> dict[str, float]:
    """CPU ms per request of each Ray process title over an interval (those that used any)."""
    per_request = {n: 1000 * (v - before.get(n, 0.0)) / max(1, requests) for n, v in after.items()}
    return {n: round(v, 2) for n, v in sorted(per_request.items(), key=lambda t: -t[1]) if v > 0.05}


def _children(pid: int) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _kind_and_rss_mb(pid: int, root: int) -> tuple[str, int] | None:
    """(driver, ray::<task or actor>, raylet, gcs_server or other; resident MB) of a live process."""
    try:
        with open(f"/proc/{pid}/status") as status:
            rss_kb = next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            cmd = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if pid == root:
        kind = "driver"
    elif cmd.startswith("ray::"):
        kind = cmd.split()[0].split("(")[0]
    elif "raylet" in cmd:
        kind = "raylet"
    elif "gcs_server" in cmd:
        kind = "gcs_server"
    else:
        kind = "other"
    return kind, rss_kb // 1024


class MemoryWatch(threading.Thread):
    """Samples /proc every `every` seconds while it runs: `peaks` is the largest resident MB one process
    of each kind reached (the driver `pid`, its raylet, GCS and Ray workers by title), `peak_total` the
    largest sum over the process tree. A worker's figure counts the shared object-store pages it touched.
    Stop it with `stop()`."""

    def __init__(self, pid: int, every: float = 0.5):
        super().__init__(daemon=True)
        self.pid = pid
        self.every = every
        self.peaks: dict[str, int] = {}
        self.peak_total = 0
        self._done = threading.Event()

    def run(self) -> None:
        """Sample until stopped."""
        while not self._done.is_set():
            kids = _children(self.pid)
            todo = [self.pid]
            total = 0
            while todo:
                pid = todo.pop()
                todo += kids.get(pid, [])
                found = _kind_and_rss_mb(pid, self.pid)
                if found:
                    kind, mb = found
                    self.peaks[kind] = max(self.peaks.get(kind, 0), mb)
                    total += mb
            self.peak_total = max(self.peak_total, total)
            time.sleep(self.every)

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        self._done.set()
        self.join()
