"""A big tenant served (the Router fans each query out to its ShardSearcher replicas) against in-process
search of the same index and queries (`SearchEngine`, what `qrag search` runs), in one run.

    python benchmarks/bench_big_tenant.py --vectors 2000000 --shards 4 --serve-env direct --out runs/bbt_direct.json
    python benchmarks/bench_big_tenant.py --vectors 2000000 --shards 4 --serve-env tuned  --out runs/bbt_proxy.json
    python benchmarks/bench_big_tenant.py --vectors 2000000 --shards 4 --serve-env haproxy --out runs/bbt_haproxy.json
    python benchmarks/bench_big_tenant.py --vectors 2000000 --shards 4 --shards-per-searcher 4 --searcher-cpus 2 \
        --baseline-ref 1e4283d
    python benchmarks/bench_big_tenant.py --vectors 20000 --shards 2 --factory Flat --queries 20   # smoke
    python benchmarks/bench_big_tenant.py --vectors 2000000 --shards 4 --data topics --filters --concurrency 1 --out runs/bbt_filters.json

The index is synthetic, because latency does not depend on what the vectors mean and 2M real vectors
would take hours to embed on this box: chunks of ~300 characters, `--vectors-per-chunk` vectors each
(kinds chunk + sentence) around a random centre, written by the package's own shard writer
(`write_shard`, one IVF-PQ quantizer trained once and shared by the shards, as `qrag index` does) with
chunks.parquet and a checksummed manifest; every document has a metadata field `bucket` (0..999, drawn at
random: benchmarks/filtered_search.py) and the float32 vectors are kept beside the index for exact
search. Queries are embedded by a tiny random-weights model
(benchmarks/tiny_model.py) on both sides, so both pay the same encoder. With `--data random` (the default)
every chunk lies around a random centre, so a query (a random direction) has no near neighbours and even
an unfiltered IVF search finds about half of its exact top 10; `--data topics` puts half of the chunks at
graded distances around the queries' own vectors (`topic_chunks`), as a real query has a few close
passages: the data for recall figures. The index is built once under --workdir and reused.

  - concurrency 1: in-process and served alternate query by query (httpx), then served once more
    through http.client (a lean client); p50/p99 of each; every served ranking is compared with the
    in-process one;
  - concurrency 8 and 32: served, blocks of --queries requests, --rounds times; in-process at the same
    concurrency is one `search` call per block of c queries (one encode, the shards searched for all);
  - CPU ms per request: served, all Ray processes over the blocks (at c=1 over both clients' requests),
    also by process, and the request path's (the app's replicas and Serve's proxy or HAProxy ingress);
    in-process, this process's CPU time.
  - with --filters: filtered search at 50%, 10%, 1%, 0.1% of the chunks against unfiltered, in process
    and served (app `new`), with recall@k against exact search over the filtered subset (filtered_search.py).
With --baseline-ref, app `base` (a worktree of that commit, its replicas importing qrag_ray from it) is
served beside app `new` (this tree) on the same index: c=1 one app after the other, the c=8/32 blocks
alternating. Targets: served CPU per request <= 1.5x in-process at c=32 (direct ingress); 100% same
rankings; filtered p50 <= 1.5x unfiltered at every selectivity and recall@10 >= 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serving import free_port, make_queries, pct  # noqa: E402
from process_cpu import cpu_by_process, ray_cpu_by_process, request_path_cpu  # noqa: E402
from serve_harness import (app_env, baseline_tree, block, check_trees, direct_ingress_urls,  # noqa: E402
                           ingress_env, start_ray, wait_ready)
from filtered_search import buckets, exact_top, print_filtered, run_filtered  # noqa: E402

WORDS = ("index shard vector replica query tenant router chunk passage question answer cluster memory "
         "latency batch model token corpus search merge score rank cache load").split()


def _sentences(rng: np.random.Generator, n: int) -> list[str]:
    words = np.asarray(WORDS)[rng.integers(0, len(WORDS), size=(n, 8))]
    return [" ".join(w).capitalize() + "." for w in words]


def topic_chunks(centres: np.ndarray, noise: np.ndarray, topics: np.ndarray, rng: np.random.Generator,
                 share: float = 0.5, near: float = 0.3, far: float = 2.0, spread: float = 0.1) -> None:
    """Put `share` of the chunks around the queries' own vectors (`topics`, unit rows), in place: each such
    chunk's centre is a query's vector moved in a random direction by a distance drawn evenly from
    near..far (about 17 to 63 degrees away), its vectors `spread` per coordinate around it (a few degrees).
    So a query has neighbours at graded distances, as a real one has a few close passages and many loosely
    related ones; the other chunks stay at random centres. `centres` (norm ~ sqrt(dim)) and `noise` (per
    coordinate) are per chunk."""
    dim = centres.shape[1]
    mine = np.flatnonzero(rng.random(len(centres)) < share)
    offset = rng.standard_normal((len(mine), dim), dtype=np.float32)
    offset *= (rng.uniform(near, far, len(mine)) / np.linalg.norm(offset, axis=1))[:, None]
    moved = topics[rng.integers(0, len(topics), size=len(mine))] + offset
    centres[mine] = np.sqrt(dim) * moved / np.linalg.norm(moved, axis=1, keepdims=True)
    noise[mine] = spread


def synthetic_index(out: Path, model: str, dim: int, vectors: int, shards: int, per_chunk: int, factory: str,
                    nprobe: int, topics: np.ndarray | None = None) -> Path:
    """Write a `qrag index`-format index of about `vectors` vectors (idempotent: a finished one is kept);
    with `topics` (query vectors) half of the chunks lie around them (topic_chunks)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qrag_ray.config.index import build_index_config, index_identity
    from qrag_ray.index.format import (CHUNKS, Counts, EmbedderInfo, FaissInfo, IndexDescription, ShardEntry,
                                       chunk_key, shard_chunks, shard_of, write_arrow, write_manifest)
    from qrag_ray.index.metadata_columns import chunk_table
    from qrag_ray.index.rows import CHUNK_PART_SCHEMA
    from qrag_ray.index.tasks import needs_training
    from qrag_ray.index.writer import build_faiss, write_shard

    if (out / "manifest.json").is_file():
        return out
    cfg = build_index_config(None, input="synthetic", representation="chunk+sentence", shards=shards,
                             embedder={"model": model}, faiss={"factory": factory, "nprobe": nprobe},
                             build={"output": str(out)})
    n_chunks = vectors // per_chunk
    rng = np.random.default_rng(0)
    ids = [f"c{i}" for i in range(n_chunks)]
    keys = np.array([chunk_key(c) for c in ids], dtype=np.int64)
    placed = np.array([shard_of(int(k), shards) for k in keys])
    flat = _sentences(rng, n_chunks * (per_chunk - 1))
    sentences = [flat[i * (per_chunk - 1):(i + 1) * (per_chunk - 1)] for i in range(n_chunks)]
    centres = rng.standard_normal((n_chunks, dim), dtype=np.float32)
    noise = np.full(n_chunks, 0.5, np.float32)  # a vector's offset from its chunk's centre, per coordinate
    if topics is not None:
        topic_chunks(centres, noise, topics, rng)

    def unit(v: np.ndarray) -> np.ndarray:
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    trained = out.parent / f"{out.name}.trained.faiss"
    if needs_training(factory, dim):
        import faiss

        n = min(cfg.faiss.train_sample, n_chunks)
        sample = unit(centres[:n] + noise[:n, None] * rng.standard_normal((n, dim), dtype=np.float32))
        faiss.write_index(build_faiss(sample, cfg.faiss, add=False), str(trained))
    tmp = out.with_name(out.name + ".partial")
    vec_dir = out.with_name(out.name + ".vectors")  # the exact vectors, for the filtered search's recall
    vec_dir.mkdir(exist_ok=True)
    bucket = buckets(n_chunks // 4 + 1)
    entries, chunk_tables = [], []
    for s in range(shards):
        mine = np.flatnonzero(placed == s)
        vec = unit(np.repeat(centres[mine], per_chunk, axis=0) + np.repeat(noise[mine], per_chunk)[:, None]
                   * rng.standard_normal((len(mine) * per_chunk, dim), dtype=np.float32))
        texts = [t for i in mine for t in [" ".join(sentences[i])] + sentences[i]]
        table = pa.table({
            "chunk_idx": np.repeat(keys[mine], per_chunk), "kind": ["chunk", *["sentence"] * (per_chunk - 1)] * len(mine),
            "qn": np.zeros(len(mine) * per_chunk, np.int32), "store": np.ones(len(mine) * per_chunk, bool),
            "text": texts, "vector": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), dim)})
        stats = write_shard(s, table, tmp, cfg.filters, cfg.faiss, dim, trained=str(trained) if trained.is_file() else None)
        order = np.argsort(keys[mine], kind="stable")  # the writer's row order: by chunk key
        np.save(vec_dir / f"{s}.npy", vec.reshape(len(mine), per_chunk, dim)[order].reshape(-1, dim))
        mine = mine[order]
        chunks = chunk_table(pa.table({
            "chunk_idx": keys[mine], "chunk_id": [ids[i] for i in mine], "doc_id": [f"d{i // 4}" for i in mine],
            "title": [f"Doc {i // 4}" for i in mine], "text": [" ".join(sentences[i]) for i in mine],
            "shard": np.full(len(mine), s, np.int32), "url": [""] * len(mine),
            "metadata": [f'{{"bucket":{bucket[i // 4]}}}' for i in mine]}, schema=CHUNK_PART_SCHEMA),
            {"bucket": "number"})
        write_arrow(chunks.drop_columns(["shard"]), tmp / shard_chunks(s))
        entries.append(ShardEntry(**stats, chunk_table=shard_chunks(s)))
        chunk_tables.append(chunks)
        print(f"  shard {s}: {entries[-1].vectors:,} vectors in {entries[-1].seconds:.0f} s", flush=True)
    with pq.ParquetWriter(tmp / CHUNKS, chunk_tables[0].schema) as w:
        for t in chunk_tables:
            w.write_table(t)
    n_vec = sum(e.vectors for e in entries)
    write_manifest(tmp, IndexDescription(
        representation="chunk+sentence", kinds=["chunk", "sentence"], embedder=EmbedderInfo(model=model, dim=dim),
        faiss=FaissInfo(factory=factory), num_shards=shards, shards=entries,
        counts=Counts(documents=n_chunks // 4 + 1, chunks=n_chunks, questions=0, vectors=n_vec,
                      vectors_before_filters=n_vec),
        config=cfg.model_dump(mode="json"), content=index_identity(cfg.model_dump(mode="json")) | {
            "metadata_schema": {"bucket": "number"}}, metadata_schema={"bucket": "number"}))
    tmp.rename(out)
    trained.unlink(missing_ok=True)
    return out


def c1(engine, url: str, queries: list[str], k: int, app: str | None = None) -> dict:
    """In-process and served alternating query by query; the served answer must rank as in-process."""
    import http.client
    from urllib.parse import urlsplit

    import httpx

    client = httpx.Client(base_url=url, timeout=600)
    parts = urlsplit(url)
    lean = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    lat: dict[str, list[float]] = {"in_process": [], "served": [], "served_http_client": []}
    same, paths, cpu, parts_ms = 0, set(), 0.0, {"embed_ms": [], "search_ms": [], "shard_search_ms": [], "format_ms": []}
    for q in queries[:5]:
        engine.search([q], k=k)
        client.post("/v1/search", json={"query": q, "k": k})
    ray_before = ray_cpu_by_process()
    for q in queries:
        c0, t0 = time.process_time(), time.perf_counter()
        want = [h["chunk_id"] for h in engine.search([q], k=k)[0]]
        lat["in_process"].append((time.perf_counter() - t0) * 1000)
        cpu += time.process_time() - c0
        t0 = time.perf_counter()
        r = client.post("/v1/search", json={"query": q, "k": k}).json()
        lat["served"].append((time.perf_counter() - t0) * 1000)
        same += [x["chunk_id"] for x in r["results"]] == want
        paths.add(r["timings"]["path"])
        for name, v in parts_ms.items():  # where the served request's time went (the Router's own timings)
            v.append(max(r["timings"][name]) if name == "shard_search_ms" else r["timings"][name])
        t0 = time.perf_counter()
        lean.request("POST", parts.path.rstrip("/") + "/v1/search", json.dumps({"query": q, "k": k}),
                     {"content-type": "application/json"})
        resp = lean.getresponse()
        resp.read()
        lat["served_http_client"].append((time.perf_counter() - t0) * 1000)
    by_proc = cpu_by_process(ray_before, ray_cpu_by_process(), 2 * len(queries))  # httpx and http.client requests
    client.close()
    lean.close()
    out = {n: {"p50_ms": pct(v, 50), "p99_ms": pct(v, 99), "mean_ms": statistics.mean(v)} for n, v in lat.items()}
    out["in_process"]["cpu_ms_per_request"] = 1000 * cpu / len(queries)
    out["served"].update(cpu_ms_per_request=sum(by_proc.values()), cpu_ms_per_request_by_process=by_proc,
                         request_path_cpu_ms=request_path_cpu(by_proc, app))
    out.update(same_ranking=same / len(queries), paths=sorted(paths),
               served_parts_p50_ms={n: pct(v, 50) for n, v in parts_ms.items()})
    return out


def concurrent(engine, urls: dict[str, str], queries: list[str], k: int, c: int, rounds: int) -> dict:
    """Blocks of `queries` at concurrency c, the apps one after the other in each round, then the in-process
    search of the same blocks; CPU of every Ray process over each app's blocks."""
    served = {n: {"ok": 0, "errors": 0, "wall_s": 0.0, "lat": [], "by_proc": {}} for n in urls}
    local = {"wall_s": 0.0, "cpu_s": 0.0, "lat": [], "n": 0}
    for _ in range(rounds):
        for n, url in urls.items():
            before = ray_cpu_by_process()
            ok, err, wall, lat = asyncio.run(block(url, queries, k, c))
            after = ray_cpu_by_process()
            one = served[n]
            one["wall_s"] += wall
            for name, v in after.items():
                one["by_proc"][name] = one["by_proc"].get(name, 0.0) + max(0.0, v - before.get(name, 0.0))
            one["ok"], one["errors"], one["lat"] = one["ok"] + ok, one["errors"] + err, one["lat"] + lat
        for i in range(0, len(queries), c):
            c0, t0 = time.process_time(), time.perf_counter()
            engine.search(queries[i:i + c], k=k)
            dt = time.perf_counter() - t0
            local["wall_s"] += dt
            local["cpu_s"] += time.process_time() - c0
            local["lat"] += [dt * 1000] * len(queries[i:i + c])
            local["n"] += len(queries[i:i + c])
    out = {n: {"qps": v["ok"] / v["wall_s"], "errors": v["errors"], "p50_ms": pct(v["lat"], 50),
               "p99_ms": pct(v["lat"], 99), "cpu_ms_per_request": 1000 * sum(v["by_proc"].values()) / max(1, v["ok"]),
               "cpu_ms_per_request_by_process": (by := cpu_by_process({}, v["by_proc"], v["ok"])),
               "request_path_cpu_ms": request_path_cpu(by, n)} for n, v in served.items()}
    out["in_process"] = {"qps": local["n"] / local["wall_s"], "p50_ms": pct(local["lat"], 50),
                         "p99_ms": pct(local["lat"], 99), "cpu_ms_per_request": 1000 * local["cpu_s"] / local["n"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vectors", type=int, default=2_000_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--vectors-per-chunk", type=int, default=8)
    ap.add_argument("--factory", default="IVF1024,PQ32x4fs,Refine(SQfp16)")
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shards-per-searcher", type=int, default=1,
                    help="the app's shards_per_searcher: consecutive shards one ShardSearcher deployment searches")
    ap.add_argument("--searcher-cpus", type=float, help="num_cpus of each ShardSearcher replica (default: the app's)")
    ap.add_argument("--serve-env", choices=("tuned", "direct", "haproxy"), default="direct",
                    help="direct: Ray's direct ingress (the Router replica serves HTTP); tuned: through Serve's "
                         "HTTP proxy (the RayService layout); haproxy: through Serve's HAProxy ingress; all with "
                         "qrag's SERVE_PROCESS_ENV")
    ap.add_argument("--baseline-ref", help="also serve a worktree of this commit (app `base`), alternating")
    ap.add_argument("--filters", action="store_true", help="also filtered search at 50/10/1/0.1%% (filtered_search.py)")
    ap.add_argument("--data", choices=("random", "topics"), default="random",
                    help="random: every chunk around a random centre (the queries have no near neighbours); "
                         "topics: half of the chunks at graded distances around the queries' vectors (topic_chunks)")
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "bench_big_tenant"))
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_big_tenant.json"))
    a = ap.parse_args()
    wd = Path(a.workdir).resolve()
    wd.mkdir(parents=True, exist_ok=True)
    ingress_env(a.serve_env)
    from tiny_model import write_tiny_model

    model = str(write_tiny_model(wd / "tiny-st"))
    t0 = time.time()
    topics = None
    if a.data == "topics":  # every distinct query of make_queries, embedded as the search embeds it
        from qrag_ray.embedding import encode, load_sentence_transformer

        topics = encode(load_sentence_transformer(model), list(dict.fromkeys(make_queries(10_000))))
    name = f"index-{a.vectors}-{a.shards}-{a.factory.replace(',', '_')}-meta" + ("-topics" if topics is not None else "")
    index = synthetic_index(wd / name, model, 64, a.vectors, a.shards, a.vectors_per_chunk, a.factory, a.nprobe,
                            topics)
    build_s = time.time() - t0
    import ray
    import torch
    from ray import serve
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    from qrag_ray.search.engine import SearchEngine
    from qrag_ray.serving.application import searcher_names

    a.out = str(Path(a.out).resolve())
    trees = {"new": ROOT} if not a.baseline_ref else {"base": baseline_tree(a.baseline_ref), "new": ROOT}
    os.chdir(wd)  # Ray hands the driver's working directory to the workers' sys.path
    start_ray()
    if a.baseline_ref:
        check_trees(trees["base"])
    port = free_port()
    client = serve_start(http_options={"host": "127.0.0.1", "port": port})
    # every tenant above `local_search_max_bytes` (64 MB) is fanned out; 0 puts a smoke-sized index there too
    searchers = {name: {"ray_actor_options": {"num_cpus": a.searcher_cpus}}
                 for name in searcher_names(a.shards, a.shards_per_searcher)} if a.searcher_cpus else {}
    client.deploy_apps(ServeDeploySchema(applications=[
        {"name": n, "route_prefix": f"/{n}", "import_path": "serve_shim:build_with_options",
         "runtime_env": app_env(tree), "args": {"index": str(index), "local_search_max_bytes": 0,
                                                "shards_per_searcher": a.shards_per_searcher,
                                                "deployment_options": searchers}} for n, tree in trees.items()]))
    if a.serve_env == "direct":
        urls = direct_ingress_urls(tuple(trees))
    else:  # Serve's proxy, or HAProxy in front of the replicas' own ports, on the one HTTP port
        urls = {n: f"http://127.0.0.1:{port}/{n}" for n in trees}
    for u in urls.values():
        wait_ready(u)
    torch.set_num_threads(1)  # one CPU, like a replica
    engine = SearchEngine(index, threads=1)
    queries = make_queries(a.queries)
    engine.search(queries[:1], k=a.k)  # its embedder loads on the first search: not a cost of any block
    report: dict = {"command": " ".join([Path(sys.executable).name] + sys.argv), "serve_env": a.serve_env,
                    "data": a.data,
                    "index": str(index), "vectors": engine.manifest.counts.vectors, "shards": a.shards,
                    "shards_per_searcher": a.shards_per_searcher, "searcher_cpus": a.searcher_cpus,
                    "baseline_ref": a.baseline_ref,
                    "factory": a.factory, "nprobe": a.nprobe, "build_s": build_s, "cpus": os.cpu_count(),
                    "load_avg_start": os.getloadavg()}
    conc = [int(c) for c in a.concurrency.split(",")]
    if 1 in conc:
        report["c1"] = {n: c1(engine, u, queries, a.k, n) for n, u in urls.items()}
    for c in (c for c in conc if c != 1):
        report[f"c{c}"] = concurrent(engine, urls, queries, a.k, c, a.rounds)
    if a.filters:
        truth = exact_top(index, index.with_name(index.name + ".vectors"), engine.embed(queries), a.k)
        report["filtered"] = run_filtered(engine, urls["new"], queries, a.k, truth, 8, a.rounds)
    report["load_avg_end"] = os.getloadavg()
    serve.shutdown()
    ray.shutdown()
    print_report(report, conc, list(urls), len(queries), a)
    if a.filters:
        print_filtered(report["filtered"], a.k, 8)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {a.out}")
    return 0


def print_report(report: dict, conc: list[int], apps: list[str], n_queries: int, a) -> None:
    print(f"\n{report['vectors']:,} vectors in {a.shards} shards ({a.factory}, nprobe {a.nprobe}; "
          f"{a.shards_per_searcher} per ShardSearcher, num_cpus {a.searcher_cpus or 1:g}), {n_queries} queries, "
          f"k={a.k}, {a.serve_env}; load avg "
          f"{report['load_avg_start'][0]:.1f} -> {report['load_avg_end'][0]:.1f}")
    print(f"{'app':5s} {'path':20s} {'conc':>4s} {'p50 ms':>8s} {'p99 ms':>8s} {'qps':>7s} {'errors':>6s} "
          f"{'CPU ms/req':>10s} {'path CPU':>9s} {'/ in-proc':>9s}")
    for app in apps:
        if 1 in conc:
            r = report["c1"][app]
            inp = r["in_process"]["cpu_ms_per_request"]
            for n in ("in_process", "served", "served_http_client"):
                cpu = f"{r[n]['cpu_ms_per_request']:10.1f}" if "cpu_ms_per_request" in r[n] else f"{'':10s}"
                path = (f"{r[n]['request_path_cpu_ms']:9.1f} {r[n]['request_path_cpu_ms'] / inp:8.2f}x"
                        if "request_path_cpu_ms" in r[n] else "")
                print(f"{app:5s} {n:20s} {1:>4d} {r[n]['p50_ms']:8.1f} {r[n]['p99_ms']:8.1f} {1000 / r[n]['mean_ms']:7.1f} "
                      f"{0:>6d} {cpu} {path}")
            r["served_p50_over_in_process"] = r["served"]["p50_ms"] / r["in_process"]["p50_ms"]
            r["request_path_over_in_process_cpu"] = r["served"]["request_path_cpu_ms"] / inp
            print(f"{app:5s} c=1 served p50 / in-process p50 {r['served_p50_over_in_process']:.2f}x "
                  f"(http.client {r['served_http_client']['p50_ms'] / r['in_process']['p50_ms']:.2f}x); same ranking "
                  f"{r['same_ranking']:.0%}; path {r['paths']}; Router parts p50 ms "
                  + ", ".join(f"{n} {v:.1f}" for n, v in r["served_parts_p50_ms"].items()))
        for c in (c for c in conc if c != 1):
            r, inp = report[f"c{c}"][app], report[f"c{c}"]["in_process"]
            r["request_path_over_in_process_cpu"] = r["request_path_cpu_ms"] / inp["cpu_ms_per_request"]
            for n, x in (("in_process", inp), ("served", r)):
                path = (f"{x['request_path_cpu_ms']:9.1f} {r['request_path_over_in_process_cpu']:8.2f}x"
                        if n == "served" else "")
                print(f"{app:5s} {n:20s} {c:>4d} {x['p50_ms']:8.1f} {x['p99_ms']:8.1f} {x['qps']:7.1f} "
                      f"{x.get('errors', 0):>6d} {x['cpu_ms_per_request']:10.1f} {path}")
        for c in conc:
            by = (report["c1"][app]["served"] if c == 1 else report[f"c{c}"][app])["cpu_ms_per_request_by_process"]
            print(f"  {app} c={c} CPU ms/request by process: " + ", ".join(f"{n} {v}" for n, v in list(by.items())[:6]))


if __name__ == "__main__":
    sys.exit(main())
