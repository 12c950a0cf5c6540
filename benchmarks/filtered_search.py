"""Filtered search on the big tenant (`bench_big_tenant.py --filters`): a metadata field `bucket` (0..999,
each value on 1/1000 of the documents, drawn at random, so "bucket < 10" passes 1% of the chunks wherever
their vectors lie), searched unfiltered and at 50%, 10%, 1% and 0.1%, in process and served: p50 and qps
at c=1 (each query at every selectivity in turn, in process then served, rankings compared), served qps
at c=8, and recall@10 of the in-process pages against exact search over the filtered subset (every
stored float32 vector of the chunks that pass, best vector per chunk)."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import numpy as np

SELECTIVITIES = (None, 50.0, 10.0, 1.0, 0.1)  # percent of the chunks that pass; None: unfiltered


def buckets(n_docs: int, seed: int = 1) -> np.ndarray:
    """Each document's bucket: a random permutation folded onto 0..999, so every value holds 1/1000."""
    return np.random.default_rng(seed).permutation(n_docs) % 1000


def bucket_filter(pct: float | None) -> dict | None:
    return None if pct is None else {"type": "lt", "key": "bucket", "value": pct * 10}


def exact_top(index: Path, vectors_dir: Path, qvecs: np.ndarray, k: int) -> dict:
    """{selectivity: per query the k best chunk ids among those that pass}, from the float32 vectors the
    synthetic index was built from (one shard's scores in memory at a time)."""
    from qrag_ray.index.format import load_manifest, read_table_file

    m = load_manifest(index)
    best: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per shard: chunk ids, buckets, (q, chunks) best
    for s in range(m.num_shards):
        rows = read_table_file(m.file(m.shard(s).meta), ["chunk_idx"]).column("chunk_idx").to_numpy()
        chunks = read_table_file(m.file(m.shard(s).chunk_table))
        keys = chunks.column("chunk_idx").to_numpy()
        ids = np.asarray(chunks.column("chunk_id").to_pylist(), dtype=object)
        bucket = chunks.column("metadata").combine_chunks().field("bucket").to_numpy()
        vecs = np.load(vectors_dir / f"{s}.npy", mmap_mode="r")
        scores = qvecs @ np.asarray(vecs).T  # rows are grouped by chunk in key order
        starts = np.searchsorted(rows, keys, "left")
        best.append((ids, bucket, np.maximum.reduceat(scores, starts, axis=1)))
    out = {}
    for pct in SELECTIVITIES:
        ids = np.concatenate([b[0] for b in best])
        sc = np.concatenate([b[2] for b in best], axis=1)
        ok = np.concatenate([b[1] for b in best]) < (1000 if pct is None else pct * 10)
        sc = np.where(ok[None, :], sc, -np.inf)
        top = np.argsort(-sc, axis=1)[:, :k]
        out[pct] = [set(ids[t].tolist()) for t in top]
    return out


async def _served_block(url: str, bodies: list[dict], concurrency: int) -> tuple[int, int, float]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    ok = errors = 0
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=2 * concurrency)) as c:
        async def one(body):
            nonlocal ok, errors
            async with sem:
                r = await c.post("/v1/search", json=body)
                ok, errors = (ok + 1, errors) if r.status_code == 200 else (ok, errors + 1)

        t0 = time.perf_counter()
        await asyncio.gather(*[one(b) for b in bodies])
        return ok, errors, time.perf_counter() - t0


def run_filtered(engine, url: str, queries: list[str], k: int, truth: dict, concurrency: int = 8,
                 rounds: int = 2) -> dict:
    """Per selectivity: in-process and served p50 / qps at c=1, served qps at `concurrency`, the share of
    served pages ranked as in process, recall@k against `truth` (exact_top). At c=1 each query is
    searched at every selectivity in turn (in process, then served), so a drift in the box's speed moves
    the filtered and unfiltered figures alike and their ratio holds."""
    import httpx

    from bench_serving import pct

    client = httpx.Client(base_url=url, timeout=600)
    bodies = {sel: {} if bucket_filter(sel) is None else {"filter": bucket_filter(sel)} for sel in SELECTIVITIES}
    for sel in SELECTIVITIES:  # warm both paths at every selectivity
        for q in queries[:3]:
            engine.search([q], k=k, filter=bucket_filter(sel))
            client.post("/v1/search", json={"query": q, "k": k, **bodies[sel]})
    local, served, same, recall, sizes = ({sel: [] for sel in SELECTIVITIES} for _ in range(5))
    for qi, q in enumerate(queries):
        for sel in SELECTIVITIES:
            t0 = time.perf_counter()
            want = engine.search([q], k=k, filter=bucket_filter(sel))[0]
            local[sel].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            r = client.post("/v1/search", json={"query": q, "k": k, **bodies[sel]})
            served[sel].append((time.perf_counter() - t0) * 1000)
            got = r.json()["results"]
            same[sel].append([x["chunk_id"] for x in got] == [x["chunk_id"] for x in want])
            sizes[sel].append(len(want))
            recall[sel].append(len({x["chunk_id"] for x in want} & truth[sel][qi]) / k)
    client.close()
    out = {}
    for sel in SELECTIVITIES:
        ok = errors = 0
        wall = 0.0
        for _ in range(rounds):
            o, e, w = asyncio.run(_served_block(url, [{"query": q, "k": k, **bodies[sel]} for q in queries], concurrency))
            ok, errors, wall = ok + o, errors + e, wall + w
        loc, srv = local[sel], served[sel]
        out["unfiltered" if sel is None else f"{sel:g}%"] = {
            "in_process": {"p50_ms": pct(loc, 50), "p99_ms": pct(loc, 99), "qps": 1000 / statistics.mean(loc)},
            "served": {"p50_ms": pct(srv, 50), "p99_ms": pct(srv, 99), "qps": 1000 / statistics.mean(srv),
                       f"qps_c{concurrency}": ok / wall, "errors": errors},
            "same_ranking": statistics.mean(same[sel]), "recall_at_k": statistics.mean(recall[sel]),
            "min_page": min(sizes[sel])}
    base = out["unfiltered"]
    for name, r in out.items():
        r["p50_over_unfiltered"] = {p: r[p]["p50_ms"] / base[p]["p50_ms"] for p in ("in_process", "served")}
    return out


def print_filtered(report: dict, k: int, concurrency: int) -> None:
    print(f"\nfiltered search (bucket < x), k={k}: p50 ms / qps at c=1 (in-process | served), served qps c={concurrency}, "
          f"recall@{k} vs exact over the subset")
    print(f"{'passes':>10s} {'in-proc p50':>11s} {'x unfilt':>8s} {'qps':>6s} | {'served p50':>10s} {'x unfilt':>8s} "
          f"{'qps':>6s} {'qps c8':>7s} {'errors':>6s} | {'recall':>6s} {'same':>5s}")
    for name, r in report.items():
        i, s = r["in_process"], r["served"]
        print(f"{name:>10s} {i['p50_ms']:11.1f} {r['p50_over_unfiltered']['in_process']:8.2f} {i['qps']:6.1f} | "
              f"{s['p50_ms']:10.1f} {r['p50_over_unfiltered']['served']:8.2f} {s['qps']:6.1f} "
              f"{s[f'qps_c{concurrency}']:7.1f} {s['errors']:6d} | {r['recall_at_k']:6.3f} {r['same_ranking']:5.0%}")
