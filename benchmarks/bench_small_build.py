"""What a small build pays besides its work, on the local Ray `qrag index` starts: a few-document index built
end to end (`build_index`, every stage), and the Parquet read every build with generation makes of the
question cache (twice: the requests it still has to send, then the answers), through Ray Data's V1 reader
(what `qrag_ray.runtime.ray_start` selects) against 2.60's default V2 reader in the same run.

    python benchmarks/bench_small_build.py [--builds 3] [--reads 5] [--docs 3] [--out runs/bench_small_build.json]

Rows: each build's wall seconds and its stages' (the embed stage's own seconds among them: the model's
passes, no actor start); the read's p50 and max per reader over --reads reads of one small Parquet file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def corpus(path: Path, docs: int) -> Path:
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    names = sorted(topics)[:docs]
    path.write_text("".join(json.dumps({"id": n, "text": unwrap(topics[n])}) + "\n" for n in names))
    return path


def time_reads(path: Path, reads: int, v2: bool) -> list[float]:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    before, ctx.use_datasource_v2 = ctx.use_datasource_v2, v2
    try:
        out = []
        for _ in range(reads):
            t = time.perf_counter()
            ray.data.read_parquet([str(path)]).materialize()
            out.append(time.perf_counter() - t)
        return out
    finally:
        ctx.use_datasource_v2 = before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--reads", type=int, default=5)
    ap.add_argument("--docs", type=int, default=3, help="documents of the Python reference to index")
    ap.add_argument("--representation", default="chunk")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_small_build.json"))
    a = ap.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qrag_ray.config.index import build_index_config
    from qrag_ray.index.build import build_index
    from qrag_ray.runtime.ray_start import ensure_ray, local_num_cpus

    tmp = Path(tempfile.mkdtemp(prefix="qrag-small-build-"))
    src = corpus(tmp / "corpus.jsonl", a.docs)
    ensure_ray(None, local_num_cpus(vllm_on_cpu=False))
    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "docs": a.docs,
           "representation": a.representation, "builds": [], "reads": {}}
    print(f"{a.docs} documents, representation {a.representation}")
    for i in range(a.builds):
        t = time.perf_counter()
        report = build_index(build_index_config(None, input=str(src), representation=a.representation, shards=2,
                                                **{"build.output": str(tmp / f"index-{i}"), "faiss.factory": "Flat"}))
        row = {"wall_s": round(time.perf_counter() - t, 2), "stages": report.stage_seconds}
        res["builds"].append(row)
        print(f"build {i}: {row['wall_s']:.1f} s; stages {json.dumps(row['stages'])}", flush=True)
    cache = tmp / "cache.parquet"
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(64)], "raw": ["What is it?"] * 64}), cache)
    for name, v2 in (("v1", False), ("v2", True)):
        times = time_reads(cache, a.reads, v2)
        res["reads"][name] = {"p50_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}
        print(f"read_parquet, one small file, Ray Data {name}: p50 {statistics.median(times):.2f} s, "
              f"max {max(times):.2f} s", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
