"""A closed-loop load in stages against a served app, the replicas of its deployments every second (Serve's
status), and what a ramp report reads from them (pure, below `run_ramp`): per stage and per window of
seconds the requests, errors and p50/p99, the replicas over time, when each deployment scaled, and for each
replica that joined under load the p99 of the window it joined in against the window before it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from benchmarks.harness.report import pct


def stages_of(text: str) -> list[tuple[int, float]]:
    """`1:30,16:90` -> [(1, 30.0), (16, 90.0)]: (concurrency, seconds) per stage."""
    return [(int(c), float(secs)) for c, secs in (part.split(":") for part in text.split(","))]


def running_replicas(app: str) -> dict[str, int]:
    """Each deployment of `app`: its RUNNING replicas now."""
    from ray import serve

    deployments = serve.status().applications[app].deployments
    return {name: sum(n for state, n in d.replica_states.items() if state == "RUNNING")
            for name, d in deployments.items()}


def run_ramp(url: str, app: str, stages: list[tuple[int, float]], request: Callable[[int], tuple[dict, dict]]) -> dict:
    """The load in stages of (concurrency, seconds), `request(n)` giving the n-th request's (body, headers);
    every request's outcome (its second, stage, status, latency, cold loads, the replicas that searched its
    shards, the Router replica that answered) and every second the RUNNING replicas of each of the app's
    deployments."""
    import httpx

    done = threading.Event()
    timeline: list[dict] = []
    counter = {"next": 0}
    lock = threading.Lock()
    started = time.time()

    def watch() -> None:
        while not done.is_set():
            timeline.append({"t": round(time.time() - started, 1), **running_replicas(app)})
            time.sleep(1.0)

    def worker(stage: int, until: float, out: list) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while time.time() < until:
                with lock:
                    number = counter["next"]
                    counter["next"] += 1
                body, headers = request(number)
                sent = time.time()
                began = time.perf_counter()
                timings: dict = {}
                try:
                    response = client.post("/v1/search", json=body, headers=headers)
                    status = response.status_code
                    if status == 200:
                        timings = response.json().get("timings") or {}
                except (httpx.HTTPError, ValueError):
                    status = 0
                out.append({"t": round(sent - started, 3), "stage": stage, "status": status,
                            "ms": (time.perf_counter() - began) * 1000, "cold": timings.get("cold_loads", 0),
                            "replicas": timings.get("shard_replicas") or [],
                            "router": timings.get("router_replica") or ""})

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results: list[dict] = []
    bounds = []
    for number, (concurrency, seconds) in enumerate(stages):
        began = time.time() - started
        until = time.time() + seconds
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _, stage=number, end=until: worker(stage, end, results), range(concurrency)))
        bounds.append((round(began, 1), round(time.time() - started, 1)))
    done.set()
    watcher.join()
    return {"results": results, "timeline": timeline, "bounds": bounds}


def _latencies(rows: list[dict]) -> dict:
    ok = [row["ms"] for row in rows if row["status"] == 200]
    return {"requests": len(rows), "errors": len(rows) - len(ok), "p50_ms": round(pct(ok, 50), 1),
            "p99_ms": round(pct(ok, 99), 1)}


def stage_rows(run: dict, stages: list[tuple[int, float]], shards: int) -> list[dict]:
    """Per stage: concurrency, its span, requests, errors, hit rate (shard searches without a cold load),
    p50/p99 of the successful requests, and each deployment's fewest and most replicas in it."""
    rows = []
    for number, (concurrency, seconds) in enumerate(stages):
        mine = [row for row in run["results"] if row["stage"] == number]
        ok = [row for row in mine if row["status"] == 200]
        begin, end = run["bounds"][number]
        seen = [row for row in run["timeline"] if begin <= row["t"] <= end]
        replicas = {name: f"{min(row[name] for row in seen)}-{max(row[name] for row in seen)}"
                    for name in deployments(run["timeline"])} if seen else {}
        rows.append({"stage": number, "concurrency": concurrency, "seconds": seconds, "from_s": begin, "to_s": end,
                     **_latencies(mine), "hit_rate": round(1 - sum(row["cold"] for row in ok)
                                                           / max(1, len(ok) * shards), 4),
                     "replicas": replicas})
    return rows


def deployments(timeline: list[dict]) -> list[str]:
    """The deployments a timeline follows."""
    return [name for name in (timeline[0] if timeline else {}) if name != "t"]


def windows(run: dict, seconds: float = 10.0) -> list[dict]:
    """Per window of `seconds` from the start: requests, errors, p50/p99, the stage most of its requests
    belong to, each deployment's most RUNNING replicas and the replicas that answered (distinct ids in the
    responses' `shard_replicas`: what the load could see)."""
    end = max([row["t"] for row in run["results"]] + [0.0])
    out = []
    start = 0.0
    while start <= end:
        mine = [row for row in run["results"] if start <= row["t"] < start + seconds]
        seen = [row for row in run["timeline"] if start <= row["t"] < start + seconds]
        stages = [row["stage"] for row in mine]
        out.append({"from_s": start, "stage": max(set(stages), key=stages.count) if stages else None,
                    **_latencies(mine),
                    "answering": len({replica for row in mine for replica in row["replicas"] if replica}),
                    **{name: max(row[name] for row in seen) for name in deployments(run["timeline"]) if seen}})
        start += seconds
    return out


def scale_events(timeline: list[dict]) -> list[dict]:
    """Every change of a deployment's RUNNING replicas: when, which, from how many to how many."""
    events = []
    for before, after in zip(timeline, timeline[1:], strict=False):
        for name in deployments(timeline):
            if after[name] != before[name]:
                events.append({"t": after["t"], "deployment": name, "from": before[name], "to": after[name]})
    return events


def first_reaching(timeline: list[dict], names: list[str], count: int, after: float) -> float | None:
    """The first second at or after `after` when every one of `names` runs at least `count` replicas."""
    return next((row["t"] for row in timeline if row["t"] >= after and all(row[n] >= count for n in names)), None)


def first_at_most(timeline: list[dict], names: list[str], count: int, after: float) -> float | None:
    """The first second at or after `after` when every one of `names` runs at most `count` replicas."""
    return next((row["t"] for row in timeline if row["t"] >= after and all(row[n] <= count for n in names)), None)


def answered_by(row: dict) -> set[str]:
    """The replicas a response names: the Router's and each shard's (none inside the Router)."""
    return {replica for replica in [row.get("router", ""), *row["replicas"]] if replica}


def join_windows(run: dict, seconds: float = 10.0, margin: float = 2.0) -> list[dict]:
    """For every replica that joined (a deployment's RUNNING count rising) while the load ran, two comparisons:
    the box's (p99 of the requests sent in the `seconds` after it joined against those in the `seconds`
    before, both inside the stage it joined in: a join at a stage's start has no window before it and is
    left out), and the replica's own (in those `seconds` after, p99 of the requests that a replica new since
    `margin` s before the join answered against the others sent in the same seconds: whether anybody waited
    on a replica still warming, whatever else the box was doing)."""
    out = []
    for event in scale_events(run["timeline"]):
        if event["to"] <= event["from"]:
            continue
        joined = event["t"]
        stage = next((n for n, (begin, end) in enumerate(run["bounds"]) if begin <= joined < end), None)
        if stage is None:
            continue
        begin, end = run["bounds"][stage]
        before = [row for row in run["results"] if max(begin, joined - seconds) <= row["t"] < joined]
        after = [row for row in run["results"] if joined <= row["t"] < min(end, joined + seconds)]
        if len(before) < 20 or len(after) < 20:
            continue
        known = set().union(*[answered_by(row) for row in run["results"] if row["t"] < joined - margin])
        new, old = [], []
        for row in after:
            (new if answered_by(row) - known else old).append(row)
        p99_before = _latencies(before)["p99_ms"]
        p99_after = _latencies(after)["p99_ms"]
        p99_new = _latencies(new)["p99_ms"] if new else None
        p99_old = _latencies(old)["p99_ms"] if old else None
        out.append({**event, "stage": stage, "p99_before_ms": p99_before, "p99_after_ms": p99_after,
                    "ratio": round(p99_after / p99_before, 2) if p99_before else None,
                    "new_requests": len(new), "p99_new_ms": p99_new, "p99_old_ms": p99_old,
                    "new_ratio": round(p99_new / p99_old, 2) if p99_new and p99_old else None})
    return out
