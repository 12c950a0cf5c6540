"""How long does `qrag index` take, and how much memory does each of its processes hold, as the corpus
grows from a few passages to a million? Does the driver's memory stay flat and the time grow linearly?

    nice -n 10 python -m benchmarks.build_scale --sizes 250000 500000 1000000 --actors 2 \\
        --work runs/pipeline-scale --out runs/pipeline-scale.json --plot docs/img/pipeline_scale.png
    python -m benchmarks.build_scale --sizes 3 --part 3 --repeat 3 --reader-check 5   # a small build's overhead
    python -m benchmarks.build_scale --tiny            # smoke: one build of 300 passages, exact search
    python -m benchmarks.build_scale --replot runs/pipeline-scale.json --plot docs/img/pipeline_scale.png

Each size is one `qrag index` (the CLI, in a subprocess) over generated passages: real English, sentences of
the Python language reference recombined 2-5 at a time under a random title. The embedder is a tiny
randomly initialised sentence-transformers model written locally (harness/models.py): the real code path
(tokenizer, forward, pooling, folder load) at a cost that lets a million passages run on 2 cores.
Printed per build: the build's resource plan, its wall seconds, its stages' seconds (the report `--json`
gives), rows per second, and the peak resident memory of the driver and of every kind of Ray process,
sampled from /proc every 0.5 s over the `qrag index` process and all its descendants (a worker's figure
counts the shared object-store pages it touched). --repeat builds each size again (a small build's cost
besides its work varies); --reader-check N also times N Ray Data reads of one small Parquet file (the
question cache's read in a build with generation) with the V1 reader, which qrag selects, and the V2
default, in this process.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.processes import MemoryWatch
from benchmarks.harness.report import write_json

PART = 250_000  # passages per corpus file by default; a size of k*part reads the first k files
FULL = {"sizes": [250_000, 500_000, 1_000_000], "part": PART, "shards": 8, "factory": "IVF1024,PQ8",
        "train_sample": 65_536}
TINY = {"sizes": [300], "part": 300, "shards": 2, "factory": "Flat", "train_sample": 1000}


def sentences() -> list[str]:
    """Sentences of the Python language reference, 30-300 characters, capitalised."""
    from pydoc_data.topics import topics

    from qrag_ray.text.sentences import split_sentences

    out = []
    for text in topics.values():
        for s in split_sentences(" ".join(text.split())):
            if 30 <= len(s) <= 300 and s[0].isupper():
                out.append(s)
    return out


def write_corpus(folder: Path, files: int, part: int, seed: int = 0) -> list[Path]:
    """`files` x `part` passages as JSONL (idempotent: complete files are kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    pool = sentences()
    words = sorted({w.strip(".,:;()").lower() for s in pool for w in s.split() if w.isalpha() and len(w) > 4})
    paths = []
    for number in range(files):
        path = folder / f"part-{number:03d}.jsonl"
        paths.append(path)
        if path.is_file():
            continue
        rng = random.Random(seed * 1000 + number)
        tmp = path.with_suffix(".partial")
        with open(tmp, "w", encoding="utf-8") as handle:
            for i in range(part):
                title = " ".join(rng.sample(words, 2)).title()
                text = " ".join(rng.sample(pool, rng.randint(2, 5)))
                handle.write(json.dumps({"id": f"p{number}-{i}", "title": title, "text": text}) + "\n")
        tmp.rename(path)
    return paths


def corpus_dir(root: Path, size: int, part: int) -> Path:
    """A folder of symlinks to the first size/part corpus files (the reader takes a folder)."""
    count = -(-size // part)
    files = write_corpus(root / f"corpus-{part}", count, part)
    folder = root / f"input-{size}-{part}"
    folder.mkdir(parents=True, exist_ok=True)
    for path in files[:count]:
        link = folder / path.name
        if not link.exists():
            link.symlink_to(path.resolve())
    return folder


def run_one(size: int, root: Path, model: str, args) -> dict:
    """One `qrag index` over `size` passages, its process tree's memory watched."""
    out = root / f"index-{size}"
    conf = root / "build.yaml"
    embedder = {"batch_size": args.batch_size, "actors": args.actors, "threads": args.threads}
    if args.num_gpus:  # the GPU build: tokenizing CPU workers, token-sized bf16 passes in the GPU actor
        embedder = {"actors": args.actors, "num_gpus": args.num_gpus}
    use_gpu = {"auto": "auto", "true": True, "false": False}[args.faiss_use_gpu]
    conf.write_text(json.dumps({"build": {"rows_per_part": args.rows_per_part, "docs_per_batch": 4096,
                                          "embedder": embedder},
                                "faiss": {"train_sample": args.train_sample, "use_gpu": use_gpu}}))
    cmd = [sys.executable, "-m", "qrag_ray.cli", "index", "--input", str(corpus_dir(root, size, args.part)),
           "--output", str(out), "--representation", "chunk", "--chunker", "none", "--shards", str(args.shards),
           "--factory", args.factory, "--embedder", model, "--config", str(conf), "--overwrite", "--json"]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = MemoryWatch(proc.pid)
    watch.start()
    stdout, stderr = proc.communicate()
    watch.stop()
    if proc.returncode:
        raise SystemExit(f"qrag index failed at {size}: {stderr[-3000:]}")
    report = json.loads(stdout[stdout.index("{"):])
    wall = time.time() - start
    stages = report.get("stage_seconds") or {}
    vectors = report.get("vectors", 0)
    workers = {k: v for k, v in watch.peaks.items() if k not in ("driver", "raylet", "gcs_server", "other")}
    # the plan the build printed at its start, one line per stage
    plan = [line for line in stderr.splitlines() if line.startswith(("plan on", "  "))][:12]
    print("\n".join(plan), flush=True)
    return {"passages": size, "vectors": vectors, "wall_s": round(wall, 1), "stage_seconds": stages,
            "plan": report.get("resources"),
            "rows_per_s": {"end_to_end": round(vectors / wall, 1),
                           "stream_wall": round(vectors / max(stages.get("stream", 1e-9), 1e-9), 1),
                           "chunk_busy": round(report.get("chunks", 0) / max(stages.get("read+chunk", 1e-9), 1e-9), 1),
                           "embed_busy": round(vectors / max(stages.get("embed", 1e-9), 1e-9), 1)},
            "peak_rss_mb": {"driver": watch.peaks.get("driver"), "raylet": watch.peaks.get("raylet"),
                            "gcs_server": watch.peaks.get("gcs_server"), "workers": workers,
                            "all_processes_total": watch.peak_total},
            "index_bytes": report.get("index_bytes")}


def table(rows: list[dict]) -> str:
    """The builds as a Markdown table."""
    head = ("| passages | wall s | stream s | embed busy rows/s | train s | shards s | publish s | "
            "driver peak MB | max worker peak MB | all procs peak MB |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for row in rows:
        stages = row["stage_seconds"]
        workers = row["peak_rss_mb"]["workers"]
        top = max(workers.items(), key=lambda kv: kv[1]) if workers else ("-", 0)
        lines.append(f"| {row['passages']:,} | {row['wall_s']:.0f} | {stages.get('stream', 0):.0f} | "
                     f"{row['rows_per_s']['embed_busy']:,.0f} | {stages.get('train', 0):.0f} | "
                     f"{stages.get('build-shards', 0):.0f} | {stages.get('publish', 0):.0f} | "
                     f"{row['peak_rss_mb']['driver']} | {top[1]} ({top[0]}) | "
                     f"{row['peak_rss_mb']['all_processes_total']} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Time and peak memory per process against the corpus size, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    millions = [r["passages"] / 1e6 for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    left.plot(millions, [r["wall_s"] / 60 for r in rows], "o-", label="total")
    left.plot(millions, [r["stage_seconds"].get("stream", 0) / 60 for r in rows], "s--", label="stream (read→embed)")
    left.set_xlabel("passages (M)")
    left.set_ylabel("minutes")
    left.legend()
    left.set_title("time")
    right.plot(millions, [r["peak_rss_mb"]["driver"] for r in rows], "o-", label="driver")
    # the pipeline's own processes; Ray's bookkeeping actors stay in the JSON but out of the plot
    names = [k for k in ("ray::MapWorker", "ray::MapBatches", "ray::ReadText->SplitBlocks", "ray::train_quantizer",
                         "ray::build_one_shard", "ray::assemble")
             if any(k in r["peak_rss_mb"]["workers"] for r in rows)]
    for name in names:
        right.plot(millions, [r["peak_rss_mb"]["workers"].get(name, 0) for r in rows], ".--", label=name)
    right.plot(millions, [r["peak_rss_mb"]["raylet"] for r in rows], "x:", label="raylet")
    right.set_xlabel("passages (M)")
    right.set_ylabel("peak RSS (MB)")
    right.set_title("memory per process")
    right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def reader_check(reads: int) -> dict:
    """p50 and max seconds of `reads` reads of one small Parquet file through Ray Data's V1 reader (what qrag
    selects) and its V2 default, on a local Ray started here (as `qrag index` starts one)."""
    import statistics
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray
    import ray.data

    path = Path(tempfile.mkdtemp(prefix="qrag-reader-")) / "cache.parquet"
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(64)], "raw": ["What is it?"] * 64}), path)
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    out = {}
    try:
        for name, v2 in (("v1", False), ("v2", True)):
            ctx.use_datasource_v2 = v2
            times = []
            for _ in range(reads):
                start = time.perf_counter()
                ray.data.read_parquet([str(path)]).materialize()
                times.append(time.perf_counter() - start)
            out[name] = {"p50_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}
            print(f"read_parquet, one small file, Ray Data {name}: p50 {out[name]['p50_s']:.2f} s, "
                  f"max {out[name]['max_s']:.2f} s", flush=True)
    finally:
        ray.shutdown()
    return out


def parse(argv: list[str] | None):
    """The options, with the full or tiny sizes."""
    parser = options.parser(__doc__)
    options.add_common(parser, "build_scale")
    parser.add_argument("--sizes", type=int, nargs="+", help="passages per build (full: 250000 500000 1000000)")
    parser.add_argument("--repeat", type=int, default=1, help="builds of each size")
    parser.add_argument("--work", default=str(options.RUNS / "pipeline-scale"), help="corpus, model and index folder")
    parser.add_argument("--plot", default=None, help="a PNG of time and memory by size (matplotlib)")
    parser.add_argument("--replot", metavar="JSON", help="only redraw --plot from a saved report")
    parser.add_argument("--reader-check", type=int, default=0, metavar="N", help="also time N Parquet reads, V1 and V2")
    parser.add_argument("--embedder", default="tiny", help="'tiny' (written locally) or a model name/folder")
    parser.add_argument("--shards", type=int)
    parser.add_argument("--factory", help="FAISS factory (full: IVF1024,PQ8; tiny: Flat)")
    parser.add_argument("--train-sample", type=int)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rows-per-part", type=int, default=8192)
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument("--keep-index", action="store_true")
    parser.add_argument("--hidden", type=int, default=32, help="tiny model width (= vector dim)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per embedding actor")
    parser.add_argument("--num-gpus", type=float, default=0, help="GPUs per embedding actor (0: a CPU build)")
    parser.add_argument("--part", type=int, help=f"passages per corpus file (default {PART}; smaller for a small run)")
    parser.add_argument("--faiss-use-gpu", choices=("auto", "true", "false"), default="auto",
                    help="faiss.use_gpu (false where the FAISS installed is the CPU build)")
    return options.sized(parser.parse_args(argv), FULL, TINY)


def main(argv: list[str] | None = None) -> int:
    """Build every size (--repeat times), then the reader check, the table, the plot and the report."""
    import shutil

    args = parse(argv)
    if args.replot:
        plot(json.loads(Path(args.replot).read_text())["runs"], Path(args.plot or "pipeline_scale.png"))
        return 0
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    model = args.embedder
    if model == "tiny":
        from benchmarks.harness.models import write_tiny_model

        model = str(write_tiny_model(root / f"tiny-st-h{args.hidden}-l{args.layers}", hidden=args.hidden,
                                     layers=args.layers, max_seq_length=args.max_seq_length).resolve())
    rows = []
    result = {"command": options.command(), "embedder": args.embedder, "factory": args.factory, "shards": args.shards,
              "cpus": os.cpu_count(), "runs": rows}
    for size in args.sizes:
        for _ in range(args.repeat):
            row = run_one(size, root, model, args)
            rows.append(row)
            print(f"{size:,} passages: {row['wall_s']} s; stages {json.dumps(row['stage_seconds'])}", flush=True)
            if not args.keep_index:
                shutil.rmtree(root / f"index-{size}", ignore_errors=True)
            write_json(result, args.out)  # after every build: a run cut short keeps what it measured
    if args.reader_check:
        result["reads"] = reader_check(args.reader_check)
    print(table(rows))
    if args.plot:
        plot(rows, Path(args.plot))
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
