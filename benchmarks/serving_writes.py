"""Writes while a tenant is served: how fresh are written documents (from the write's 202 to searchable,
and a deletion until search stops returning the document), what do writes cost the searches running beside
them and the Writer on a big tenant, and does a compaction give what a fresh full build gives?

    python -m benchmarks.serving_writes                        # both parts at full size
    python -m benchmarks.serving_writes --parts freshness      # or big
    python -m benchmarks.serving_writes --writes 1000 --rate 20 --clients 8 --big-vectors 2000000
    python -m benchmarks.serving_writes --tiny                 # smoke: 120 documents, 40 writes, 20k vectors

Everything goes through the HTTP API of one served app (the harness's: Router, Writer, ShardSearchers on a
local Ray), every tenant on a versioned root (`publish_version`) with a write-scope key, automatic
compaction off (the benchmark compacts itself).

Part `freshness` (the default representation, MiniLM, no LLM): a tenant of --documents SQuAD v1.1 dev
contexts (--squad; where that file is missing, paragraphs of the Python language reference, which ships
with Python), built once under --workdir. --clients closed-loop clients search it (SQuAD questions) for
--before-s seconds, then go on while --writes single-document upserts are sent open loop at --rate per
second (each a POST /v1/documents, then GET /v1/writes/{id} every --poll-s until `searchable`): the
contexts left out of the base as new documents, then edits of base documents (their sentences rotated by
one). Reported: seconds from the 202 to searchable (the status's `searchable_at` against the moment the
202 arrived; also as the polls saw it) p50/p95/max, failed searches, search p50/p99 before and during the
writes. Then a base document is deleted and searched for by its own first sentence every 50 ms: the seconds
until it is gone. Then `qrag compact ROOT`'s function (qrag_ray.index.compaction.compact, on the app's
Ray) folds the writes into a new version; once the app serves it, the served pages of --queries questions
are compared with a fresh full build of the same documents searched in process (chunk ids and scores to
1e-5) and the two versions' files.

Part `big`: the cost of one upsert of --upsert-docs documents on a small tenant against a big one (the
status's `searchable_at - submitted_at`, the Writer's pass from the log to searchable, --upserts times
each, alternating), then the big tenant's search p50 with a delta of about --delta-rows vector rows
against the same index without writes (two roots published from one index, blocks of --queries searches
at concurrency 1 alternating --rounds times). "Big" is serving_big's synthetic tenant
(harness/synthetic.py: --big-vectors vectors, IVF-PQ, a tiny random-weights embedder, chunk and sentence
vectors, no BM25), built once under --workdir with that embedder so the Writer can load it, and "small"
the same kind of index of --small-vectors vectors (Flat); written documents are synthetic text of the
same words.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.report import pct, print_table, write_json
from benchmarks.harness.write_load import (
    K,
    api_document,
    bearer,
    deletion,
    delta_vectors,
    freshness_summary,
    search_page,
    search_summary,
    squad_or_reference,
    synthetic_documents,
    timed_upsert,
    upserts_of,
    write_corpus,
    writes_beside_searches,
)

# ../shared/data/... of the main checkout, or of a worktree one folder deeper
SQUAD = next((p for p in (options.ROOT.parent / "shared", options.ROOT.parents[1] / "shared")
              if (p / "data" / "squad-v1.1" / "dev-v1.1.json").is_file()),
             options.ROOT.parent / "shared") / "data" / "squad-v1.1" / "dev-v1.1.json"
BIG_FACTORY = "IVF1024,PQ32x4fs,Refine(SQfp16)"
FULL = {"documents": 2000, "writes": 1000, "rate": 20.0, "clients": 8, "before_s": 30.0, "queries": 200,
        "big_vectors": 2_000_000, "small_vectors": 20_000, "upserts": 5, "delta_rows": 10_000, "rounds": 3,
        "factory": BIG_FACTORY}
TINY = {"documents": 120, "writes": 40, "rate": 10.0, "clients": 2, "before_s": 5.0, "queries": 20,
        "big_vectors": 20_000, "small_vectors": 4_000, "upserts": 2, "delta_rows": 1_000, "rounds": 1,
        "factory": "Flat"}
SHARDS = 2  # the freshness tenant's
SYNTHETIC_SHARDS = 4
VECTORS_PER_CHUNK = 8
TARGETS = {"p95_to_searchable_s": 5.0, "failed_searches": 0, "delete_gone_s": 1.0, "upsert_cost_ratio": 2.0,
           "delta_search_ratio": 1.2}


def parse(argv: list[str] | None):
    """The options, with the full or tiny sizes."""
    parser = options.parser(__doc__)
    options.add_common(parser, "serving_writes", queries=True, rounds=True, workdir=True)
    parser.add_argument("--parts", default="freshness,big", help="freshness and/or big (default: %(default)s)")
    parser.add_argument("--squad", default=str(SQUAD), help="SQuAD v1.1 JSON (default: %(default)s)")
    parser.add_argument("--documents", type=int, help="the freshness tenant's base documents")
    parser.add_argument("--writes", type=int, help="single-document upserts")
    parser.add_argument("--rate", type=float, help="upserts per second (open loop)")
    parser.add_argument("--clients", type=int, help="closed-loop search clients beside the writes")
    parser.add_argument("--before-s", type=float, help="seconds of searches before the writes start")
    parser.add_argument("--poll-s", type=float, default=0.5, help="seconds between a write's status polls")
    parser.add_argument("--big-vectors", type=int, help="the big synthetic tenant's vectors")
    parser.add_argument("--small-vectors", type=int, help="the small synthetic tenant's vectors")
    parser.add_argument("--factory", help=f"the big tenant's FAISS factory (full: {BIG_FACTORY}; tiny: Flat)")
    parser.add_argument("--upserts", type=int, help="upserts per tenant in the cost comparison")
    parser.add_argument("--upsert-docs", type=int, default=100, help="documents per upsert in the cost comparison")
    parser.add_argument("--delta-rows", type=int, help="vector rows the big tenant's delta grows to")
    parser.add_argument("--serve-env", default="tuned", help="the harness's ingress layout (default: %(default)s)")
    args = options.sized(parser.parse_args(argv), FULL, TINY)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(args.parts) - {"freshness", "big"}
    if unknown or not args.parts:
        parser.error(f"--parts: freshness and/or big, got {','.join(sorted(unknown)) or 'nothing'}")
    return args




def compaction_check(client, headers: dict, root: Path, base_spec: dict, final: list[dict], queries: list[str],
                     workdir: Path) -> dict:
    """Compact the root; once the app serves the new version, its pages against a fresh full build's."""
    import json

    from qrag_ray.config.index import build_index_config
    from qrag_ray.index.build import build_index
    from qrag_ray.index.compaction import compact
    from qrag_ray.index.versions import resolve_index
    from qrag_ray.search.engine import SearchEngine

    served_before = search_page(client, headers, queries[0])["index_version"]
    start = time.perf_counter()
    summary = compact(root)
    compact_s = time.perf_counter() - start
    compacted = resolve_index(root).dir
    version = json.loads((compacted / "manifest.json").read_text())["index_version"]
    deadline = time.time() + 300
    while search_page(client, headers, queries[0])["index_version"] != version:
        if time.time() > deadline:
            raise RuntimeError(f"the app still serves {served_before}, not the compacted {version}")
        time.sleep(0.5)
    swap_s = time.perf_counter() - start - compact_s
    served = [[(hit["chunk_id"], hit["score"]) for hit in search_page(client, headers, q)["results"]] for q in queries]

    fresh = workdir / "fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    spec = {**base_spec, "input": str(write_corpus(workdir / "fresh.jsonl", final)), "build.output": str(fresh),
            "build.keep_work": False}
    start = time.perf_counter()
    build_index(build_index_config(None, **spec))
    fresh_build_s = time.perf_counter() - start
    engine = SearchEngine(fresh, threads=1)
    built = [[(hit["chunk_id"], hit["score"]) for hit in page] for page in engine.search(queries, k=K)]
    differing = 0
    worst = 0.0
    for served_page, built_page in zip(served, built, strict=True):
        same_ids = [c for c, _ in served_page] == [c for c, _ in built_page]
        gap = max((abs(a - b) for (_, a), (_, b) in zip(served_page, built_page, strict=False)), default=0.0)
        worst = max(worst, gap) if same_ids else worst
        differing += not (same_ids and gap <= 1e-5)
    compacted_files = json.loads((compacted / "manifest.json").read_text())["files"]
    fresh_files = json.loads((fresh / "manifest.json").read_text())["files"]
    return {"compacted": summary.get("compacted"), "compact_s": compact_s, "swap_s": swap_s,
            "vectors_embedded": summary.get("vectors_embedded"), "vectors_reused": summary.get("vectors_reused"),
            "fresh_build_s": fresh_build_s, "queries": len(queries), "differing_pages": differing,
            "identical": differing == 0, "max_score_gap_same_ids": worst,
            "files_identical": compacted_files == fresh_files,
            "empty_pages": sum(not page for page in served)}


def freshness_part(url: str, key: str, root: Path, corpus: list[dict], base_count: int, questions: list[str],
                   base_spec: dict, workdir: Path, args) -> dict:
    """The freshness part on the served tenant."""
    import httpx

    headers = bearer(key)
    warmup = {**corpus[0], "doc_id": "warm-up", "text": corpus[0]["text"] + " (warm-up)"}
    with httpx.Client(base_url=url, timeout=600) as client:  # the Writer loads the tenant's embedder on its first
        cold = timed_upsert(client, headers, [api_document(warmup)])  # write: measured apart from the rest
    writes = upserts_of(corpus, base_count, args.writes)
    run = asyncio.run(writes_beside_searches(url, headers, [api_document(d) for d in writes], questions, args))
    report = {"first_write": cold, "freshness": freshness_summary(run, len(writes)),
              "search_before": search_summary([r for r in run["searches"] if r["phase"] == "before"]),
              "search_during": search_summary([r for r in run["searches"] if r["phase"] == "writes"])}
    final = {d["doc_id"]: d for d in [*corpus[:base_count], warmup]}
    for document in writes:
        final[document["doc_id"]] = document
    with httpx.Client(base_url=url, timeout=120) as client:
        report["deletion"] = deletion(client, headers, corpus[1:base_count:2])
        final.pop(report["deletion"]["doc_id"])
        report["compaction"] = compaction_check(client, headers, root, base_spec, list(final.values()),
                                                questions[:args.queries], workdir)
    return report




def big_part(url: str, keys: dict[str, str], roots: dict[str, Path], queries: list[str], args) -> dict:
    """Upsert cost on the small and the big tenant, then the big tenant's search with and without a delta."""
    import httpx

    from benchmarks.harness.load import closed_loop

    costs: dict[str, list[dict]] = {"small": [], "big": []}
    with httpx.Client(base_url=url, timeout=600) as client:
        first = {tenant: timed_upsert(client, bearer(keys[tenant]), synthetic_documents(f"{tenant}-warm-up", 1, 0))
                 for tenant in costs}  # the Writer loads the tenants' embedder on a first write
        for n in range(args.upserts):
            for tenant in ("small", "big"):
                documents = synthetic_documents(f"{tenant}-{n}", args.upsert_docs, seed=n)
                costs[tenant].append(timed_upsert(client, bearer(keys[tenant]), documents))
        grown = []
        batch = 0
        while delta_vectors(roots["big"]) < args.delta_rows:
            documents = synthetic_documents(f"grow-{batch}", 1000, seed=1000 + batch)
            grown.append(timed_upsert(client, bearer(keys["big"]), documents))
            batch += 1
    rows = delta_vectors(roots["big"])
    bodies = [{"query": q, "k": K} for q in queries]
    latencies: dict[str, list[float]] = {"big": [], "unwritten": []}
    for tenant in latencies:  # warm-up: the shards load, connections open
        closed_loop(url, bodies[:5], 1, [bearer(keys[tenant])] * 5)
    failed = 0
    for _ in range(args.rounds):
        for tenant in ("unwritten", "big"):
            block = closed_loop(url, bodies, 1, [bearer(keys[tenant])] * len(bodies))["records"]
            latencies[tenant] += [r["ms"] for r in block if r["status"] == 200]
            failed += sum(r["status"] != 200 for r in block)
    writer = {tenant: statistics.median(c["writer_s"] for c in runs) for tenant, runs in costs.items()}
    p50 = {tenant: pct(values, 50) for tenant, values in latencies.items()}
    return {"first_writes": first, "upserts": costs, "writer_median_s": writer,
            "upsert_cost_ratio": writer["big"] / writer["small"],
            "grow_upserts": grown, "delta_rows": rows, "search_failed": failed,
            "search_p50_ms": p50, "search_p99_ms": {t: pct(v, 99) for t, v in latencies.items()},
            "delta_search_ratio": p50["big"] / p50["unwritten"]}


# ---- the run -------------------------------------------------------------------------------------------------
def publish_root(root: Path, index: Path) -> Path:
    """A fresh versioned root holding `index` as its current version."""
    from qrag_ray.index.versions import publish_version

    shutil.rmtree(root, ignore_errors=True)
    publish_version(root, index)
    return root


def measure(args) -> dict:
    """Build (once) and publish the tenants, serve them in one app, run the parts."""
    from benchmarks.harness import served, trees
    from benchmarks.harness.indexes import build_indexes, make_queries, manifest
    from benchmarks.harness.synthetic import big_tenant
    from qrag_ray.serving.tenants import add_tenant

    layout_env = served.ingress_env(args.serve_env)
    workdir = Path(args.workdir).resolve()
    trees.leave_the_tree(workdir)
    report: dict = {"command": options.command(), "serve_env": args.serve_env, "serve_vars": layout_env,
                    "targets": TARGETS}
    tenants_file = workdir / "tenants.yaml"
    tenants_file.unlink(missing_ok=True)
    keys: dict[str, str] = {}
    roots: dict[str, Path] = {}
    if "freshness" in args.parts:
        corpus, questions, source = squad_or_reference(args.squad, args.queries)
        base_count = min(args.documents, len(corpus) - 1)
        base_spec = {"format": "jsonl", "shards": SHARDS}
        base_input = workdir / f"base-{base_count}.jsonl"
        if not base_input.is_file():
            write_corpus(base_input, corpus[:base_count])
        base = workdir / f"index-{base_count}"
        start = time.perf_counter()
        build_indexes(options.ROOT, [{**base_spec, "input": str(base_input), "build.output": str(base),
                                      "build.keep_work": True}], workdir)
        report["freshness_tenant"] = {"source": source, "documents": base_count, "build_s": time.perf_counter() - start,
                                      "counts": manifest(base)["counts"], "representation": "default"}
        roots["squad"] = publish_root(workdir / "roots" / "squad", base)
    if "big" in args.parts:
        synthetic = workdir / "synthetic"
        start = time.perf_counter()
        small = big_tenant(synthetic, args.small_vectors, SYNTHETIC_SHARDS, VECTORS_PER_CHUNK, "Flat", 16)
        big = big_tenant(synthetic, args.big_vectors, SYNTHETIC_SHARDS, VECTORS_PER_CHUNK, args.factory, 16)
        report["big_tenants"] = {"small": {"index": str(small), "vectors": manifest(small)["counts"]["vectors"]},
                                 "big": {"index": str(big), "vectors": manifest(big)["counts"]["vectors"],
                                         "factory": args.factory},
                                 "build_s": time.perf_counter() - start}
        roots["small"] = publish_root(workdir / "roots" / "small", small)
        roots["big"] = publish_root(workdir / "roots" / "big", big)
        roots["unwritten"] = publish_root(workdir / "roots" / "unwritten", big)
    for tenant, root in roots.items():
        keys[tenant] = add_tenant(tenants_file, tenant, root, scope="write")

    served.start_ray()
    client, port = served.start_serve()
    app_args = {"tenants": str(tenants_file), "request_timeout_s": 60,
                "writes": {"auto_compact": False, "scan_s": 2.0}}
    served.deploy(client, [served.app_config("writes", options.ROOT, app_args)])
    url = served.app_urls(["writes"], args.serve_env, port)["writes"]
    for key in keys.values():
        served.wait_ready(url, key)
    try:
        if "freshness" in args.parts:
            report["freshness_part"] = freshness_part(url, keys["squad"], roots["squad"], corpus, base_count,
                                                      questions, {**base_spec}, workdir, args)
        if "big" in args.parts:
            report["big_part"] = big_part(url, keys, roots, make_queries(args.queries), args)
    finally:
        served.shutdown()
    return report


def verdicts(report: dict) -> list[dict]:
    """Each measured figure against its target."""
    rows = []
    if "freshness_part" in report:
        part = report["freshness_part"]
        fresh = part["freshness"]
        rows += [
            {"figure": "202 -> searchable p50 / p95 / max s", "value": f"{fresh['p50_s']:.2f} / {fresh['p95_s']:.2f} / "
             f"{fresh['max_s']:.2f}", "target": "p95 <= 5", "met": fresh["p95_s"] <= TARGETS["p95_to_searchable_s"]},
            {"figure": "first write (the Writer loads the embedder), s",
             "value": f"{part['first_write']['writer_s']:.2f}",
             "target": "", "met": None},
            {"figure": "writes searchable / sent", "value": f"{fresh['searchable']} / {fresh['writes']}",
             "target": "all", "met": fresh["failed_writes"] == 0},
            {"figure": "failed searches (before, during)",
             "value": f"{part['search_before']['failed']}, {part['search_during']['failed']}", "target": "0",
             "met": part["search_before"]["failed"] + part["search_during"]["failed"] == 0},
            {"figure": "search p50 / p99 ms before writes",
             "value": f"{part['search_before']['p50_ms']:.1f} / {part['search_before']['p99_ms']:.1f}",
             "target": "", "met": None},
            {"figure": "search p50 / p99 ms during writes",
             "value": f"{part['search_during']['p50_ms']:.1f} / {part['search_during']['p99_ms']:.1f}",
             "target": "", "met": None},
            {"figure": "deletion gone from search, s", "value": f"{part['deletion']['gone_s']:.2f}",
             "target": "<= 1", "met": part["deletion"]["gone_s"] <= TARGETS["delete_gone_s"]},
            {"figure": "compacted pages = fresh build's (differing)",
             "value": f"{'yes' if part['compaction']['identical'] else 'no'} "
                      f"({part['compaction']['differing_pages']} of {part['compaction']['queries']})",
             "target": "identical", "met": part["compaction"]["identical"]},
            {"figure": "compacted files = fresh build's", "value": "yes" if part["compaction"]["files_identical"]
             else "no", "target": "", "met": None}]
    if "big_part" in report:
        part = report["big_part"]
        writer = part["writer_median_s"]
        rows += [
            {"figure": "upsert of 100 docs, Writer s: small / big", "value": f"{writer['small']:.2f} / "
             f"{writer['big']:.2f} ({part['upsert_cost_ratio']:.2f}x)", "target": "<= 2x",
             "met": max(part["upsert_cost_ratio"], 1 / part["upsert_cost_ratio"]) <= TARGETS["upsert_cost_ratio"]},
            {"figure": f"big search p50 ms: no delta / {part['delta_rows']:,}-row delta",
             "value": f"{part['search_p50_ms']['unwritten']:.1f} / {part['search_p50_ms']['big']:.1f} "
                      f"({part['delta_search_ratio']:.2f}x)", "target": "<= 1.2x",
             "met": part["delta_search_ratio"] <= TARGETS["delta_search_ratio"] and part["search_failed"] == 0}]
    for row in rows:
        row["met"] = {True: "yes", False: "NO", None: ""}[row["met"]]
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse, measure, print the table and write the report."""
    args = parse(argv)
    out = Path(args.out).resolve()
    report = measure(args)
    report["verdicts"] = verdicts(report)
    print_table([("figure", "figure", ""), ("measured", "value", ""), ("target", "target", ""), ("met", "met", "")],
                report["verdicts"], "Writes while serving")
    write_json(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
