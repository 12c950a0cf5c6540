"""Pipeline scale run: `qrag index` over 250k / 500k / 1M generated passages, with per-stage
throughput and the peak RSS of the driver and of every Ray worker.

What it proves: the streaming build keeps the driver's memory flat as the corpus grows (it only sums
per-batch counters; workers write the checkpoint parts and the shard files) and total time grows
linearly. The embedder is a tiny randomly initialised sentence-transformers model written locally
(benchmarks/tiny_model.py): the real code path (tokenizer, forward, pooling, folder load) at a cost that
lets a million passages run on 2 cores. Passages are real English: sentences of the Python language
reference (pydoc_data, shipped with Python) recombined 2-5 at a time under a random title.

    nice -n 10 python benchmarks/bench_pipeline_scale.py --sizes 250000 500000 1000000 \\
        --work runs/pipeline-scale --out runs/pipeline-scale.json --plot docs/img/pipeline_scale.png

Memory is sampled from /proc every 0.5 s over the `qrag index` process and all its descendants
(raylet, GCS, workers named `ray::<stage>`); "peak" is the largest RSS one process of that class
reached. Worker RSS counts the shared object-store pages a worker touched.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

PART = 250_000  # passages per corpus file; a size of k*PART reads the first k files


def sentences() -> list[str]:
    from pydoc_data.topics import topics

    from qrag_ray.text.sentences import split_sentences

    out = []
    for text in topics.values():
        for s in split_sentences(" ".join(text.split())):
            if 30 <= len(s) <= 300 and s[0].isupper():
                out.append(s)
    return out


def write_corpus(folder: Path, files: int, seed: int = 0) -> list[Path]:
    """files x PART passages as JSONL (idempotent: complete files are kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    pool = sentences()
    words = sorted({w.strip(".,:;()").lower() for s in pool for w in s.split() if w.isalpha() and len(w) > 4})
    paths = []
    for f in range(files):
        p = folder / f"part-{f:03d}.jsonl"
        paths.append(p)
        if p.is_file():
            continue
        rng = random.Random(seed * 1000 + f)
        tmp = p.with_suffix(".partial")
        with open(tmp, "w", encoding="utf-8") as fh:
            for i in range(PART):
                title = " ".join(rng.sample(words, 2)).title()
                text = " ".join(rng.sample(pool, rng.randint(2, 5)))
                fh.write(json.dumps({"id": f"p{f}-{i}", "title": title, "text": text}) + "\n")
        tmp.rename(p)
    return paths


def corpus_dir(root: Path, size: int) -> Path:
    """A folder of symlinks to the first size/PART corpus files (the reader takes a folder)."""
    k = -(-size // PART)
    files = write_corpus(root / "corpus", k)
    d = root / f"input-{size}"
    d.mkdir(parents=True, exist_ok=True)
    for p in files[:k]:
        link = d / p.name
        if not link.exists():
            link.symlink_to(p.resolve())
    return d


def _children(pid: int) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _classify(pid: int, root: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if pid == root:
        name = "driver"
    elif cmd.startswith("ray::"):
        name = cmd.split()[0].split("(")[0]
    elif "raylet" in cmd:
        name = "raylet"
    elif "gcs_server" in cmd:
        name = "gcs_server"
    else:
        name = "other"
    return name, rss // 1024  # MB


class MemoryWatch(threading.Thread):
    def __init__(self, pid: int, every: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.every, self.peaks, self.peak_total, self.stop = pid, every, {}, 0, False

    def run(self):
        while not self.stop:
            kids, todo, total = _children(self.pid), [self.pid], 0
            while todo:
                p = todo.pop()
                todo += kids.get(p, [])
                got = _classify(p, self.pid)
                if got:
                    name, mb = got
                    self.peaks[name] = max(self.peaks.get(name, 0), mb)
                    total += mb
            self.peak_total = max(self.peak_total, total)
            time.sleep(self.every)


def run_one(size: int, root: Path, model: str, args) -> dict:
    inp = corpus_dir(root, size)
    out = root / f"index-{size}"
    conf = root / "build.yaml"
    emb = {"batch_size": args.batch_size, "actors": args.actors, "threads": args.threads}
    if args.num_gpus:  # the GPU build: tokenizing CPU workers, token-sized bf16 passes in the GPU actor
        emb = {"actors": args.actors, "num_gpus": args.num_gpus}
    use_gpu = {"auto": "auto", "true": True, "false": False}[args.faiss_use_gpu]
    conf.write_text(json.dumps({"build": {"rows_per_part": args.rows_per_part, "docs_per_batch": 4096, "embedder": emb},
                                "faiss": {"train_sample": args.train_sample, "use_gpu": use_gpu}}))
    cmd = [sys.executable, "-m", "qrag_ray.cli", "index", "--input", str(inp), "--output", str(out),
           "--representation", "chunk", "--chunker", "none", "--shards", str(args.shards),
           "--factory", args.factory, "--embedder", model, "--config", str(conf), "--overwrite", "--json"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = MemoryWatch(proc.pid)
    watch.start()
    stdout, stderr = proc.communicate()
    watch.stop = True
    watch.join()
    if proc.returncode:
        raise SystemExit(f"qrag index failed at {size}: {stderr[-3000:]}")
    report = json.loads(stdout[stdout.index("{"):])
    wall = time.time() - t0
    st = report["stage_seconds"]
    workers = {k: v for k, v in watch.peaks.items() if k not in ("driver", "raylet", "gcs_server", "other")}
    # the plan the build printed at start (qrag_ray/index/resource_plan.py), one line per stage
    plan = [line for line in stderr.splitlines() if line.startswith(("plan on", "  "))][:12]
    print("\n".join(plan), flush=True)
    return {"passages": size, "vectors": report["vectors"], "wall_s": round(wall, 1), "stage_seconds": st,
            "plan": report.get("resources"),
            "rows_per_s": {"end_to_end": round(report["vectors"] / wall, 1),
                           "stream_wall": round(report["vectors"] / max(st.get("stream", 1e-9), 1e-9), 1),
                           "chunk_busy": round(report["chunks"] / max(st.get("read+chunk", 1e-9), 1e-9), 1),
                           "embed_busy": round(report["vectors"] / max(st.get("embed", 1e-9), 1e-9), 1)},
            "peak_rss_mb": {"driver": watch.peaks.get("driver"), "raylet": watch.peaks.get("raylet"),
                            "gcs_server": watch.peaks.get("gcs_server"), "workers": workers,
                            "all_processes_total": watch.peak_total},
            "index_bytes": report["index_bytes"]}


def table(rows: list[dict]) -> str:
    head = ("| passages | wall s | stream s | embed busy rows/s | train s | shards s | publish s | "
            "driver peak MB | max worker peak MB | all procs peak MB |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        st = r["stage_seconds"]
        w = r["peak_rss_mb"]["workers"]
        top = max(w.items(), key=lambda kv: kv[1]) if w else ("-", 0)
        lines.append(f"| {r['passages']:,} | {r['wall_s']:.0f} | {st.get('stream', 0):.0f} | "
                     f"{r['rows_per_s']['embed_busy']:,.0f} | {st.get('train', 0):.0f} | "
                     f"{st.get('build-shards', 0):.0f} | {st.get('publish', 0):.0f} | "
                     f"{r['peak_rss_mb']['driver']} | {top[1]} ({top[0]}) | {r['peak_rss_mb']['all_processes_total']} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["passages"] / 1e6 for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    a.plot(n, [r["wall_s"] / 60 for r in rows], "o-", label="total")
    a.plot(n, [r["stage_seconds"].get("stream", 0) / 60 for r in rows], "s--", label="stream (read→embed)")
    a.set_xlabel("passages (M)"), a.set_ylabel("minutes"), a.legend(), a.set_title("time")
    b.plot(n, [r["peak_rss_mb"]["driver"] for r in rows], "o-", label="driver")
    # the pipeline's own processes; Ray's bookkeeping actors stay in the JSON but out of the plot
    names = [k for k in ("ray::MapWorker", "ray::MapBatches", "ray::ReadText->SplitBlocks", "ray::train_quantizer",
                         "ray::build_one_shard", "ray::assemble") if any(k in r["peak_rss_mb"]["workers"] for r in rows)]
    for k in names:
        b.plot(n, [r["peak_rss_mb"]["workers"].get(k, 0) for r in rows], ".--", label=k)
    b.plot(n, [r["peak_rss_mb"]["raylet"] for r in rows], "x:", label="raylet")
    b.set_xlabel("passages (M)"), b.set_ylabel("peak RSS (MB)"), b.set_title("memory per process")
    b.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def replot(json_path: str, png: str) -> None:
    """Redraw the plot from a saved result: python -c 'from bench_pipeline_scale import replot; ...'."""
    plot(json.loads(Path(json_path).read_text())["runs"], Path(png))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[250_000, 500_000, 1_000_000])
    ap.add_argument("--work", default="runs/pipeline-scale")
    ap.add_argument("--out", default="runs/pipeline-scale.json")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--embedder", default="tiny", help="'tiny' (written locally) or a model name/folder")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--factory", default="IVF1024,PQ8")
    ap.add_argument("--train-sample", type=int, default=65_536)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rows-per-part", type=int, default=8192)
    ap.add_argument("--actors", type=int, default=1)
    ap.add_argument("--keep-index", action="store_true")
    ap.add_argument("--hidden", type=int, default=32, help="tiny model width (= vector dim)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--max-seq-length", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per embedding actor")
    ap.add_argument("--num-gpus", type=float, default=0, help="GPUs per embedding actor (0: a CPU build)")
    ap.add_argument("--part", type=int, default=PART, help="passages per corpus file (smaller for a smoke run)")
    ap.add_argument("--faiss-use-gpu", choices=("auto", "true", "false"), default="auto",
                    help="faiss.use_gpu (false where the FAISS installed is the CPU build)")
    args = ap.parse_args()
    globals()["PART"] = args.part
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    model = args.embedder
    if model == "tiny":
        from tiny_model import write_tiny_model  # benchmarks/, beside this script

        model = str(write_tiny_model(root / f"tiny-st-h{args.hidden}-l{args.layers}", hidden=args.hidden,
                                     layers=args.layers, max_seq_length=args.max_seq_length).resolve())
    rows = []
    prev = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    for size in args.sizes:
        r = run_one(size, root, model, args)
        rows.append(r)
        print(json.dumps(r), flush=True)
        if not args.keep_index:
            import shutil

            shutil.rmtree(root / f"index-{size}", ignore_errors=True)
        result = {"command": " ".join(sys.argv), "embedder": args.embedder, "factory": args.factory,
                  "shards": args.shards, "cpus": os.cpu_count(), "runs": rows, "previous": prev.get("runs")}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(rows))
    if args.plot:
        plot(rows, Path(args.plot))


if __name__ == "__main__":
    main()
