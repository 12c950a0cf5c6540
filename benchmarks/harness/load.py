"""Load on served apps: closed-loop blocks of searches at a concurrency (each client sends its next request
when its last one answered), the apps' blocks alternating round by round with the CPU of every Ray
process over each block; and at concurrency 1 the in-process `SearchEngine` and every app query by query
(in turn, so all see the same machine load), each served page checked to rank as the in-process one.

What a response carries beyond the API's results (`took_ms`, the Router's `timings`) is read defensively:
a field another tree does not write is left out, never an error."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import statistics
import time
from urllib.parse import urlsplit

from benchmarks.harness.processes import cpu_by_process, ingress_cpu, ray_cpu_by_process, request_path_cpu
from benchmarks.harness.report import latency, pct, print_table

COLUMNS = [("path", "path", ""), ("conc", "concurrency", "d"), ("p50 ms", "p50_ms", ".1f"), ("p99 ms", "p99_ms", ".1f"),
           ("qps", "qps", ".1f"), ("errors", "errors", "d"), ("CPU ms/req", "cpu_ms_per_request", ".2f"),
           ("path CPU", "request_path_cpu_ms", ".2f"), ("qps@all cores", "qps_if_all_cores", ".1f"),
           ("same ranking", "same_ranking", ".0%")]


def _numbers(timings) -> dict[str, float]:
    """The numeric fields of a response's `timings` (a list, such as per-shard times, as its largest)."""
    out = {}
    for name, value in (timings or {}).items() if isinstance(timings, dict) else ():
        if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
            value = max(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


async def _closed_loop(url: str, requests: list[tuple[dict, dict]], concurrency: int) -> tuple[list[dict], float]:
    import httpx

    records: list[dict] = []
    pending = iter(enumerate(requests))
    limits = httpx.Limits(max_connections=2 * concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def one_client() -> None:
            """One client: the next request as soon as its last one answered, until none are left."""
            for i, (body, headers) in pending:
                start = time.perf_counter()
                try:
                    response = await client.post("/v1/search", json=body, headers=headers)
                    status = response.status_code
                    answer = response.json() if status == 200 else {}
                except (httpx.HTTPError, ValueError):
                    status = 0
                    answer = {}
                records.append({"i": i, "status": status, "ms": (time.perf_counter() - start) * 1000,
                                "end": time.time(), "timings": _numbers(answer.get("timings"))})

        start = time.perf_counter()
        await asyncio.gather(*[one_client() for _ in range(concurrency)])
        return records, time.perf_counter() - start


def closed_loop(url: str, bodies: list[dict], concurrency: int, headers: list[dict] | None = None) -> dict:
    """Every body searched once at `url`, `concurrency` clients (headers[i] with bodies[i], e.g. a tenant's
    key): {"records": per request its number i, status, ms, end time and numeric timings (in the order
    they answered), "wall_s"}."""
    requests = list(zip(bodies, headers or [{}] * len(bodies), strict=True))
    records, wall = asyncio.run(_closed_loop(url, requests, concurrency))
    return {"records": records, "wall_s": wall}


def summarize(records: list[dict], wall_s: float) -> dict:
    """ok, errors, qps, p50/p99, and how the Router shared its work: the mean query-embedding batch, the
    mean search pass (searches per pass, so passes per request) and each pass's merge and format ms per
    query, where the responses say so."""
    ok = [r for r in records if r["status"] == 200]
    out = {"ok": len(ok), "errors": len(records) - len(ok), "qps": len(ok) / wall_s if wall_s else float("nan"),
           **{k: v for k, v in latency([r["ms"] for r in ok]).items() if k != "n"}}
    timings = [r["timings"] for r in ok]
    if any("embed_batch" in t for t in timings):
        out["embed_batch_mean"] = statistics.mean(t.get("embed_batch", 1) for t in timings)
    if any("search_batch" in t for t in timings):
        out["passes_per_request"] = statistics.mean(1 / max(1.0, t.get("search_batch", 1)) for t in timings)
        for name in ("merge_ms", "format_ms"):
            if any(name in t for t in timings):
                out[f"pass_{name}_per_query"] = statistics.mean(t.get(name, 0.0) / max(1.0, t.get("search_batch", 1))
                                                                for t in timings)
    return out


def alternating_blocks(urls: dict[str, str], bodies: list[dict], concurrency: int, rounds: int,
                       engine=None, k: int = 10) -> dict:
    """`rounds` rounds of one closed-loop block of `bodies` per app, the apps in turn; per app qps, latency
    and the CPU ms per request of every Ray process over its blocks (also the request path's and the qps
    that CPU allows with every core busy: on a shared machine wall-clock qps measures the CPU share an
    app won). With `engine`, the same queries in process, one `search` call per c queries."""
    records: dict[str, list[dict]] = {n: [] for n in urls}
    walls = dict.fromkeys(urls, 0.0)
    cpu = {n: {} for n in urls}
    local = {"wall_s": 0.0, "cpu_s": 0.0, "lat": []}
    for _ in range(rounds):
        for name, url in urls.items():
            before = ray_cpu_by_process()
            block = closed_loop(url, bodies, concurrency)
            after = ray_cpu_by_process()
            for title, seconds in after.items():
                cpu[name][title] = cpu[name].get(title, 0.0) + max(0.0, seconds - before.get(title, 0.0))
            records[name] += block["records"]
            walls[name] += block["wall_s"]
        if engine is not None:
            queries = [b["query"] for b in bodies]
            for i in range(0, len(queries), concurrency):
                part = queries[i:i + concurrency]
                cpu0 = time.process_time()
                start = time.perf_counter()
                engine.search(part, k=k)
                took = time.perf_counter() - start
                local["wall_s"] += took
                local["cpu_s"] += time.process_time() - cpu0
                local["lat"] += [took * 1000] * len(part)
    out = {}
    for name in urls:
        row = summarize(records[name], walls[name])
        by_process = cpu_by_process({}, cpu[name], row["ok"])
        total = sum(cpu[name].values())
        row.update(cpu_ms_per_request=1000 * total / max(1, row["ok"]), cpu_ms_per_request_by_process=by_process,
                   request_path_cpu_ms=request_path_cpu(by_process, name),
                   qps_if_all_cores=(os.cpu_count() or 1) * row["ok"] / max(total, 1e-9))
        out[name] = row
    if engine is not None:
        searched = len(local["lat"])
        out["in_process"] = {"ok": searched, "errors": 0, "qps": searched / local["wall_s"],
                             "p50_ms": pct(local["lat"], 50), "p99_ms": pct(local["lat"], 99),
                             "cpu_ms_per_request": 1000 * local["cpu_s"] / searched}
    return out


class _Lean:
    """A kept-alive http.client connection: a lean client (httpx spends about 1 ms of CPU a request in the
    client itself on a small box, which is neither Serve's cost nor the engine's)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.path = parts.path.rstrip("/") + "/v1/search"
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)

    def search(self, body: dict) -> tuple[int, dict]:
        """POST one search: (status, the answer's JSON or {})."""
        self.conn.request("POST", self.path, json.dumps(body), {"content-type": "application/json"})
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if resp.status == 200 else {})


def _ids(results) -> list:
    return [x["chunk_id"] for x in results or []]


def interleaved_c1(engine, urls: dict[str, str], queries: list[str], k: int, filters: dict | None = None) -> dict:
    """Concurrency 1, query by query: the in-process search, then each app over httpx and over http.client.
    Per path p50/p99; per app the share of pages ranked exactly as in process (both clients), the handler's
    own account (took_ms and every numeric timing, p50) and the CPU ms per request of its request path;
    in process, this process's CPU ms per query."""
    import httpx

    body = {"k": k, **({"filter": filters} if filters else {})}
    clients = {n: httpx.Client(base_url=u, timeout=600) for n, u in urls.items()}
    lean = {n: _Lean(u) for n, u in urls.items()}
    for query in queries[:5]:  # warm-up: the engine's model, connections, the apps' first loads
        engine.search([query], k=k, filter=filters)
        for name in urls:
            clients[name].post("/v1/search", json={"query": query, **body})
            lean[name].search({"query": query, **body})
    lat: dict[str, list[float]] = {"in_process": [], **{n: [] for n in urls}, **{f"{n}_http_client": [] for n in urls}}
    same = dict.fromkeys(urls, 0)
    handler: dict[str, dict[str, list[float]]] = {n: {} for n in urls}
    cpu_in_process = 0.0
    before = ray_cpu_by_process()
    for query in queries:
        cpu0 = time.process_time()
        start = time.perf_counter()
        want = _ids(engine.search([query], k=k, filter=filters)[0])
        lat["in_process"].append((time.perf_counter() - start) * 1000)
        cpu_in_process += time.process_time() - cpu0
        for name in urls:
            start = time.perf_counter()
            response = clients[name].post("/v1/search", json={"query": query, **body})
            lat[name].append((time.perf_counter() - start) * 1000)
            answer = response.json() if response.status_code == 200 else {}
            same[name] += _ids(answer.get("results")) == want
            for field, value in {"took_ms": answer.get("took_ms"), **_numbers(answer.get("timings"))}.items():
                if isinstance(value, (int, float)):
                    handler[name].setdefault(field, []).append(value)
            start = time.perf_counter()
            status, answer = lean[name].search({"query": query, **body})
            lat[f"{name}_http_client"].append((time.perf_counter() - start) * 1000)
            same[name] += status == 200 and _ids(answer.get("results")) == want
    by_title = cpu_by_process(before, ray_cpu_by_process(), 1)  # CPU ms over the loop, per title
    for client in clients.values():
        client.close()
    out = {path: latency(values) for path, values in lat.items()}
    out["in_process"]["cpu_ms_per_request"] = 1000 * cpu_in_process / len(queries)
    served = 2 * len(queries)  # requests per app (httpx and http.client)
    ingress = ingress_cpu(by_title)  # Serve's proxy or HAProxy: shared by the apps
    for name in urls:
        out[name].update(same_ranking=same[name] / served,
                         handler_p50_ms={f: round(pct(v, 50), 3) for f, v in handler[name].items()},
                         request_path_cpu_ms=(request_path_cpu(by_title, name) - ingress) / served
                         + ingress / (served * len(urls)))
    out["cpu_ms_by_process"] = by_title
    return out


def rows_of(report: dict) -> list[dict]:
    """A row per path and concurrency of a report's `c1` (interleaved_c1) and `blocks` (alternating_blocks)."""
    rows = []
    if "c1" in report:
        c1 = report["c1"]
        for path, r in c1.items():
            if isinstance(r, dict) and "p50_ms" in r:
                app = path.removesuffix("_http_client")
                rows.append({"path": path, "concurrency": 1, "qps": 1000 / r["mean_ms"], "errors": 0, **r,
                             "same_ranking": c1.get(app, {}).get("same_ranking")})
    for c, block in report["blocks"].items():
        rows += [{"path": path, "concurrency": int(c), **r} for path, r in block.items()]
    return rows


def print_served(report: dict, title: str) -> None:
    """The table of a served run's `c1` and `blocks`, and per app the ratios and the CPU by process."""
    print_table(COLUMNS, rows_of(report), title)
    c1 = report.get("c1", {})
    for app in ("new", "base"):
        if app in c1:
            ratio = c1[app]["p50_ms"] / c1["in_process"]["p50_ms"]
            lean = c1[f"{app}_http_client"]["p50_ms"] / c1["in_process"]["p50_ms"]
            cpu = c1[app]["request_path_cpu_ms"] / c1["in_process"]["cpu_ms_per_request"]
            print(f"c=1 {app}: served p50 / in-process p50 {ratio:.2f}x (http.client {lean:.2f}x), request path CPU / "
                  f"in-process CPU {cpu:.2f}x; handler p50 ms "
                  + ", ".join(f"{f} {v}" for f, v in c1[app]["handler_p50_ms"].items()))
    for c, block in report["blocks"].items():
        for app in ("new", "base"):
            if app in block:
                top = list(block[app]["cpu_ms_per_request_by_process"].items())[:5]
                ratio = ""
                if "in_process" in block:
                    cpu = block[app]["request_path_cpu_ms"] / block["in_process"]["cpu_ms_per_request"]
                    ratio = f"request path / in-process CPU {cpu:.2f}x; "
                print(f"c={c} {app}: {ratio}CPU ms/request by process: " + ", ".join(f"{n} {v}" for n, v in top))
        if "base" in block:
            print(f"c={c} new / base: qps {block['new']['qps'] / block['base']['qps']:.2f}x wall clock, "
                  f"{block['base']['cpu_ms_per_request'] / block['new']['cpu_ms_per_request']:.2f}x by CPU per request")
