"""Many tenants on shared ShardSearcher replicas: a tenant's cold first query, the steady CPU per request
against the in-process search of the same queries, and tenant affinity (Serve model multiplexing)
against any replica; with --baseline-ref, the same requests against a baseline commit in the same run.

    python benchmarks/bench_tenants.py [--tenants 200] [--indexes 4] [--replicas 2] [--budget-x 4]
                                       [--requests 2000] [--concurrency 8] [--baseline-ref 813b65c]
                                       [--rounds 2] [--layouts affine,spread] [--out runs/bench_tenants.json]

--indexes small indexes (slices of the Python language reference, 2 shards each, one vector per chunk,
~0.3 MB a tenant) are registered under --tenants names, tenant i on index i % --indexes. A loaded shard
is cached per tenant (the cache key names the tenant), so the tenants' bytes total N times an index's,
and each ShardSearcher replica's budget (`shard_cache_bytes`) is set so that this total is --budget-x
times one replica's budget: no replica can hold every tenant. Every tenant fans out to the ShardSearcher
deployments (`local_search_max_bytes: 0`), --replicas replicas each, with qrag's SERVE_PROCESS_ENV
(`--serve-env`: through Serve's proxy, or direct ingress). Requests pick a tenant by Zipf(1.1) rank,
--concurrency at a time, under the app's deadline (`--timeout`, 10 s as `qrag serve` has it).

Each app (`new`: this tree; `base`: a worktree of --baseline-ref, its replicas importing qrag_ray from
it) runs on fresh replicas, nothing loaded at start but the Router's query embedder (one query of a
tenant outside the mix), the apps alternating --rounds times. Per run:
  - warm-up (the first --warmup requests, cold tenants): p50/p99, deadline misses (504), errors, and
    each tenant's first query (p50/p99/max);
  - steady state (the rest): hit rate (1 - cold loads / shard calls, from `timings.cold_loads`), cold
    loads per minute, p50/p99, qps, errors, and the CPU ms per request of every Ray process (the
    request path: the replicas and Serve's proxy) over that phase;
  - in-process (this process, once): the same steady queries, each searched alone on its tenant's index
    with `SearchEngine` (torch and FAISS on one thread, like a replica): CPU ms per query.
With --ramp (e.g. `1:30,16:90,1:150`: concurrency:seconds stages), each layout of this tree then runs
again on replicas that autoscale (Router 1..2, every ShardSearcher 1..--replicas, --target-ongoing and
the --upscale/--downscale delays): per stage the requests, errors, hit rate, p50/p99; when a replica was
added after the load rose and when the deployments were back to one after it fell (bench_ramp.py).
A synthetic tenant mix on small indexes, on one machine: what it shows is the per-request cost and the
cache behaviour, not the latency of a big index.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serving import free_port, make_queries, pct  # noqa: E402
from process_cpu import cpu_by_process, ray_cpu_by_process, request_path_cpu  # noqa: E402
from serve_harness import (app_env, baseline_tree, check_trees, direct_ingress_urls, ingress_env,  # noqa: E402
                           start_ray)


def build_indexes(workdir: Path, n: int) -> list[Path]:
    """`n` small indexes, each the chunks of every n-th topic of the language reference (2 shards, one
    vector per chunk). One `qrag index` build embeds them all; each slice is then written by the package's
    shard writer from that build's vectors, which is what a build of its topics alone writes (chunks are
    cut per document): one embedding run instead of n on a shared 2-core box."""
    from pydoc_data.topics import topics

    full = workdir / "index"
    if not (full / "manifest.json").is_file():
        from qrag_ray.config.index import build_index_config
        from qrag_ray.index.build import build_index as build
        from qrag_ray.io.pydoc_corpus import write_pydoc_corpus

        write_pydoc_corpus(workdir / "corpus.jsonl")
        build(build_index_config(None, input=str(workdir / "corpus.jsonl"), format="jsonl", representation="chunk",
                                 shards=2, build={"output": str(full), "overwrite": True},
                                 generator={"backend": "none"}, chunker={"method": "token", "size": 200, "overlap": 20}))
        import ray

        ray.shutdown()  # the build's own local Ray: the benchmark starts the one it measures
    names = sorted(topics)
    return [slice_index(full, workdir / f"index-{i}-of-{n}", set(names[i::n])) for i in range(n)]


def slice_index(full: Path, out: Path, docs: set[str]) -> Path:
    """The chunks of `docs` in index `full`, as an index of their own under `out` (kept once written)."""
    import faiss
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from qrag_ray.config.index import index_config
    from qrag_ray.index.format import (CHUNKS, Counts, IndexDescription, ShardEntry, load_manifest, read_table_file,
                                       shard_chunks, write_arrow, write_manifest)
    from qrag_ray.index.rows import CHUNK_SCHEMA
    from qrag_ray.index.writer import write_shard

    if (out / "manifest.json").is_file():
        return out
    m = load_manifest(full)
    cfg = index_config(m.config)
    chunks = pq.read_table(full / CHUNKS)
    chunks = chunks.filter(pc.is_in(chunks.column("doc_id"), pa.array(sorted(docs))))
    keep = pa.array(chunks.column("chunk_idx").to_numpy())
    tmp = out.with_name(out.name + ".partial")
    entries, tables = [], []
    for s in range(m.num_shards):
        info = m.shard(s)
        meta = read_table_file(m.file(info.meta))
        index = faiss.read_index(str(m.file(info.faiss)))
        rows = np.flatnonzero(pc.is_in(meta.column("chunk_idx"), keep).to_numpy(zero_copy_only=False))
        vecs = index.reconstruct_n(0, index.ntotal)[rows]
        part = meta.take(pa.array(rows))
        table = pa.table({"chunk_idx": part.column("chunk_idx"), "kind": part.column("kind").cast(pa.string()),
                          "qn": np.full(len(rows), -1, np.int32), "store": np.ones(len(rows), bool),
                          "text": part.column("text"),
                          "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), vecs.shape[1])})
        stats = write_shard(s, table, tmp, cfg.filters, cfg.faiss, m.dim)
        mine = chunks.filter(pc.equal(chunks.column("shard"), s)).sort_by("chunk_idx")
        write_arrow(mine.drop_columns(["shard"]), tmp / shard_chunks(s))
        entries.append(ShardEntry(**stats, chunk_table=shard_chunks(s)))
        tables.append(mine)
    pq.write_table(pa.concat_tables(tables).cast(CHUNK_SCHEMA), tmp / CHUNKS)
    n_vec = sum(e.vectors for e in entries)
    write_manifest(tmp, IndexDescription(
        representation=m.representation, kinds=m.kinds, embedder=m.embedder, faiss=m.faiss, num_shards=m.num_shards,
        shards=entries, counts=Counts(documents=len(docs), chunks=chunks.num_rows, questions=0, vectors=n_vec,
                                      vectors_before_filters=n_vec),
        config=m.config, content={**(m.content or {}), "input": f"{m.config.get('input')} ({len(docs)} topics)"}))
    tmp.rename(out)
    return out


def zipf_ranks(n_tenants: int, n: int, s: float = 1.1, seed: int = 0) -> np.ndarray:
    p = 1.0 / np.arange(1, n_tenants + 1) ** s
    return np.random.default_rng(seed).choice(n_tenants, size=n, p=p / p.sum())


def send(url: str, keys: list[str], ranks: np.ndarray, queries: list[str], concurrency: int) -> list[dict]:
    """Every request in order, `concurrency` clients at a time: status, seconds, cold loads, end time."""
    import httpx

    out: list[dict | None] = [None] * len(ranks)

    def worker(w: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in range(w, len(ranks), concurrency):
                t0 = time.perf_counter()
                try:
                    r = client.post("/v1/search", json={"query": queries[i % len(queries)], "k": 5},
                                    headers={"Authorization": f"Bearer {keys[ranks[i]]}"})
                    body, status = r.json(), r.status_code
                except (httpx.HTTPError, ValueError) as e:
                    body, status = {"error": type(e).__name__}, 0
                t = (body.get("timings") or {}) if status == 200 else {}
                out[i] = {"s": time.perf_counter() - t0, "status": status, "t": time.time(),
                          "cold": t.get("cold_loads", 0), "embed_batch": t.get("embed_batch", 0)}

    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(worker, range(concurrency)))
    return out  # type: ignore[return-value]


def summary(rs: list[dict]) -> dict:
    lat = [r["s"] * 1000 for r in rs if r["status"] == 200]
    return {"requests": len(rs), "errors": sum(r["status"] != 200 for r in rs),
            "deadline_misses": sum(r["status"] == 504 for r in rs),
            "p50_ms": round(pct(lat, 50), 1), "p99_ms": round(pct(lat, 99), 1), "max_ms": round(max(lat, default=0), 1)}


def run_app(url: str, app: str, keys: list[str], ranks: np.ndarray, queries: list[str], concurrency: int,
            warmup: int, shards: int, primer: str) -> dict:
    import httpx

    # one query of a tenant outside the mix first: the Router's query embedder loads (a server started with
    # warm_tenants > 0 has it loaded before it is ready), every tenant of the mix stays cold
    r = httpx.post(f"{url}/v1/search", json={"query": queries[0], "k": 5}, headers={"Authorization": f"Bearer {primer}"},
                   timeout=300)
    r.raise_for_status()
    before = ray_cpu_by_process()
    warm = send(url, keys, ranks[:warmup], queries, concurrency)
    mid = ray_cpu_by_process()
    steady = send(url, keys, ranks[warmup:], np.roll(queries, -warmup).tolist(), concurrency)
    after = ray_cpu_by_process()
    first = [r for i, r in enumerate(warm) if ranks[i] not in set(ranks[:i].tolist())]
    ok = [r for r in steady if r["status"] == 200]
    cold = sum(r["cold"] for r in ok)
    wall = (max(r["t"] for r in steady) - min(r["t"] - r["s"] for r in steady)) or float("nan")
    by_proc = cpu_by_process(mid, after, len(ok))
    return {"warmup": {**summary(warm), "cold_loads": sum(r["cold"] for r in warm if r["status"] == 200),
                       "first_queries": summary(first),
                       "cpu_ms_per_request": round(sum(cpu_by_process(before, mid, len(warm)).values()), 2)},
            "steady": {**summary(steady), "hit_rate": round(1 - cold / max(1, len(ok) * shards), 4),
                       "cold_loads": cold, "cold_loads_per_min": round(60 * cold / wall, 1),
                       "qps": round(len(ok) / wall, 1), "cpu_ms_per_request": round(sum(by_proc.values()), 2),
                       "embed_batch_mean": round(statistics.mean([r["embed_batch"] for r in ok] or [0]), 2),
                       "request_path_cpu_ms": round(request_path_cpu(by_proc, app), 2),
                       "cpu_ms_per_request_by_process": dict(list(by_proc.items())[:8])}}


def in_process_cpu(indexes: list[Path], tenant_index: list[int], ranks: np.ndarray, queries: list[str]) -> dict:
    """Each query searched alone on its tenant's index, in this process: CPU ms and wall ms per query."""
    import torch

    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)
    engines = [SearchEngine(ix, threads=1) for ix in indexes]
    for e in engines:
        e.search([queries[0]], k=5)
    cpu, lat = [], []
    for i, rank in enumerate(ranks):
        c0, t0 = time.process_time(), time.perf_counter()
        engines[tenant_index[rank]].search([queries[i % len(queries)]], k=5)
        cpu.append((time.process_time() - c0) * 1000)
        lat.append((time.perf_counter() - t0) * 1000)
    return {"queries": len(ranks), "cpu_ms_per_query": round(statistics.mean(cpu), 2),
            "p50_ms": round(pct(lat, 50), 2)}


def deploy(client, name: str, tree: Path, args: dict, deployments: dict) -> None:
    from ray.serve.schema import ServeDeploySchema

    app = {"name": name, "route_prefix": f"/{name}", "import_path": "serve_shim:build_with_options",
           "args": {**args, "deployment_options": deployments}, "runtime_env": app_env(tree)}
    client.deploy_apps(ServeDeploySchema(applications=[app]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "bench_tenants"))
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--indexes", type=int, default=4, help="distinct small indexes the tenants are spread over")
    ap.add_argument("--own-copies", action="store_true",
                    help="each tenant on its own copy of its index (else the tenants of one index share its files)")
    ap.add_argument("--replicas", type=int, default=2, help="replicas of every ShardSearcher deployment")
    ap.add_argument("--budget-x", type=float, default=4.0, help="tenants' bytes / one replica's budget")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, help="requests of the warm-up phase (default: --tenants)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=10.0, help="the app's request_timeout_s")
    ap.add_argument("--layouts", default="affine", help="affine (tenant_affinity on) and/or spread (off)")
    ap.add_argument("--shards-per-searcher", type=int, default=1)
    ap.add_argument("--baseline-ref", help="also run a worktree of this commit, alternating with this tree")
    ap.add_argument("--rounds", type=int, default=1, help="times each app runs (alternating)")
    ap.add_argument("--serve-env", choices=("tuned", "direct", "haproxy"), default="tuned",
                    help="tuned: through Serve's HTTP proxy with qrag's SERVE_PROCESS_ENV; direct: direct ingress; "
                         "haproxy: through Serve's HAProxy ingress")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_tenants.json"))
    a = ap.parse_args()
    wd = Path(a.workdir).resolve()
    wd.mkdir(parents=True, exist_ok=True)
    ingress_env(a.serve_env)
    import ray
    from ray import serve
    from ray.serve._private.api import serve_start

    from qrag_ray.cli.serve_cmd import wait_healthy
    from qrag_ray.index.format import load_manifest
    from qrag_ray.search.shard_search import load_shard
    from qrag_ray.serving.application import searcher_names
    from qrag_ray.serving.tenants import add_tenant

    a.out = str(Path(a.out).resolve())
    indexes = build_indexes(wd, a.indexes)
    trees = {"new": ROOT} if not a.baseline_ref else {"base": baseline_tree(a.baseline_ref), "new": ROOT}
    os.chdir(wd)  # Ray hands the driver's working directory to the workers' sys.path
    start_ray()
    if a.baseline_ref:
        check_trees(trees["base"])
    mans = [load_manifest(ix) for ix in indexes]
    shard_bytes = [[load_shard(m, s, verify=False).nbytes for s in range(m.num_shards)] for m in mans]
    tenant_index = [i % a.indexes for i in range(a.tenants)]
    per_tenant = [sum(shard_bytes[j]) for j in tenant_index]
    budget = max(1 << 20, int(sum(per_tenant) / 2 / a.budget_x))  # two shard deployments share the bytes
    tf = wd / "tenants.yaml"
    tf.unlink(missing_ok=True)
    paths = [indexes[j] for j in tenant_index]
    if a.own_copies:  # as tenants with their own indexes have: nothing read or verified once serves another
        import shutil

        for i, src in enumerate(paths):
            if not ((dst := wd / "copies" / f"t{i:04d}") / "manifest.json").is_file():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            paths[i] = dst
    keys = [add_tenant(tf, f"t{i:04d}", paths[i]) for i in range(a.tenants)]
    primer = add_tenant(tf, "primer", indexes[0])  # asked once before each run, never in the mix
    ranks = zipf_ranks(a.tenants, a.requests)
    queries = make_queries(97)
    warmup = a.warmup if a.warmup is not None else a.tenants
    shards = mans[0].num_shards
    report = {"command": " ".join([Path(sys.executable).name] + sys.argv), "cpus": os.cpu_count(),
              "tenants": a.tenants, "indexes": a.indexes, "shards": shards, "shard_bytes": shard_bytes,
              "tenant_bytes_max": max(per_tenant), "replicas_per_shard": a.replicas, "replica_budget_bytes": budget,
              "tenant_bytes_total": sum(per_tenant), "budget_x": a.budget_x, "serve_env": a.serve_env,
              "distinct_tenants_asked": int(len(np.unique(ranks))), "concurrency": a.concurrency,
              "warmup": warmup, "baseline_ref": a.baseline_ref, "own_copies": a.own_copies,
              "load_avg_start": os.getloadavg(), "runs": []}
    print(f"{a.tenants} tenants on {a.indexes} indexes x {shards} shards (up to {max(per_tenant) / 1e6:.2f} MB a "
          f"tenant), replica budget {budget / 1e6:.1f} MB (tenants' total = {a.budget_x:g}x), {a.replicas} replicas "
          f"per shard, {a.requests} requests at c={a.concurrency}, deadline {a.timeout:g} s", flush=True)
    report["in_process"] = in_process_cpu(indexes, tenant_index, ranks[warmup:], np.roll(queries, -warmup).tolist())
    print(f"in-process: {report['in_process']}", flush=True)
    port = free_port()
    client = serve_start(http_options={"host": "127.0.0.1", "port": port})
    small = {"ray_actor_options": {"num_cpus": 0.25}}
    opts = {"Router": {"ray_actor_options": {"num_cpus": 1}, "num_replicas": 1},
            **{name: {**small, "num_replicas": a.replicas} for name in searcher_names(shards, a.shards_per_searcher)}}
    for _ in range(a.rounds):
        for layout in a.layouts.split(","):
            for tree_name, tree in trees.items():
                name = f"{tree_name}-{layout}"
                args = {"tenants": str(tf), "local_search_max_bytes": 0, "warm_tenants": 0, "shard_cache_bytes": budget,
                        "tenant_affinity": layout == "affine", "request_timeout_s": a.timeout,
                        "shards_per_searcher": a.shards_per_searcher}
                deploy(client, name, tree, args, opts)
                url = (direct_ingress_urls((name,))[name] if a.serve_env == "direct"
                       else f"http://127.0.0.1:{port}/{name}")  # Serve's proxy, or HAProxy, on the one port
                wait_healthy(url)
                r = {"app": tree_name, "layout": layout, "load_avg": os.getloadavg()[0],
                     **run_app(url, name, keys, ranks, queries, a.concurrency, warmup, shards, primer)}
                report["runs"].append(r)
                w, s = r["warmup"], r["steady"]
                print(f"| {tree_name} | {layout} | warm-up p50/p99 {w['p50_ms']}/{w['p99_ms']} ms, first queries p99 "
                      f"{w['first_queries']['p99_ms']} max {w['first_queries']['max_ms']}, misses "
                      f"{w['deadline_misses']}, errors {w['errors']} | steady p50/p99 {s['p50_ms']}/{s['p99_ms']}, "
                      f"qps {s['qps']}, hit rate {s['hit_rate']:.3f}, CPU ms/req {s['cpu_ms_per_request']} "
                      f"(path {s['request_path_cpu_ms']}; in-process {report['in_process']['cpu_ms_per_query']}), "
                      f"errors {s['errors']} |", flush=True)
                client.delete_apps([name])
                Path(a.out).parent.mkdir(parents=True, exist_ok=True)
                Path(a.out).write_text(json.dumps(report, indent=2))
    report["load_avg_end"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(report, indent=2))
    serve.shutdown()
    ray.shutdown()
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
