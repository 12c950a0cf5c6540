"""Resident memory of a loaded shard against the raw bytes it holds, this tree against a baseline commit.

    python benchmarks/bench_shard_memory.py --index runs/suite-quick/dl19/indexes/chunk+sentence+window \
        [--baseline-ref 77efe35] [--out runs/bench_shard_memory.json]

Each shard is loaded by `load_shard` (what `qrag search`, the Router and every ShardSearcher replica
call) in a fresh Python process; resident = that process's RSS after the load minus its RSS before it
(imports done, one Parquet read made), and after every row has been read once (a memory-mapped file's pages all
loaded: the most a shard holds). Raw = the FAISS file (the index as FAISS holds it) + the row
metadata's texts and ids (8-byte chunk key per vector) + the shard's chunks' texts and ids (and their
typed url / metadata columns); with metadata also after a filter on its first field. The
baseline loads the same files from a git worktree of `--baseline-ref` (PYTHONPATH), in its own
process, one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from serve_harness import baseline_tree

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import gc, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
import faiss, numpy, pyarrow.parquet  # imported before the first reading
try:
    from qrag_ray.search.shard_search import load_shard
except ImportError:  # before the one retrieval core: the Serve shard store's loader
    from qrag_ray.serving.shard_store import load_shard as _load
    load_shard = lambda index, shard: _load(index, shard, None)  # noqa: E731
# the first Parquet read of a process maps the reader's code and starts its thread pool (~70 MB here,
# once per process, not per shard): done before the first reading
pyarrow.parquet.read_table(sys.argv[1] + "/chunks.parquet", columns=["shard"])
gc.collect(); before = rss()
ls = load_shard(sys.argv[1], int(sys.argv[2]))
gc.collect(); after = rss()
try:  # every row's text and every chunk read once: a memory-mapped shard's pages all loaded (the most it holds)
    import pyarrow.compute as pc
    chunk_cols = ls.chunks.columns if hasattr(ls.chunks, "columns") else ls.chunks  # a Table, or its columns
    for col in (ls.index.text, *chunk_cols):
        pc.sum(pc.utf8_length(col))  # reads every byte (binary_length would read only the offsets)
    read_all = rss() - before
except AttributeError:  # a tree whose shard keeps its texts otherwise
    read_all = None
filtered = None
if getattr(ls, "metadata", None) is not None:  # a filter on the first field: its column read, a selection made
    from qrag_ray.search.filters import compile_filter
    name, typ = next(iter(ls.index.manifest.metadata_schema.items()))
    value = {"number": 0, "bool": True, "date": "2000-01-01", "datetime": "2000-01-01"}.get(typ, "")
    sel = ls.select(compile_filter({"type": "ne", "key": name, "value": value}, None, ls.index.manifest.metadata_schema))
    gc.collect(); filtered = rss() - before
print(json.dumps({"resident": after - before, "resident_all_read": read_all, "resident_filtered": filtered,
                  "reported": ls.nbytes}))
"""


def raw_bytes(index: Path, shard: int) -> int:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from qrag_ray.index.format import read_table_file

    m = json.loads((index / "manifest.json").read_text())
    s = m["shards"][shard]
    meta = read_table_file(index / s["meta"], ["text"])
    chunks = pq.read_table(index / "chunks.parquet", columns=["shard", "chunk_id", "doc_id", "title", "text"])
    chunks = chunks.filter(pc.equal(chunks.column("shard"), shard))
    text = lambda col: sum(len(t.encode()) for t in col.to_pylist() if t)  # noqa: E731
    typed = read_table_file(index / s["chunk_table"]) if s.get("chunk_table") else None  # url / metadata columns
    extra = sum(typed.column(c).nbytes for c in ("url", "metadata") if c in typed.column_names) if typed else 0
    return ((index / s["faiss"]).stat().st_size + text(meta.column("text")) + 8 * meta.num_rows
            + sum(text(chunks.column(c)) for c in ("chunk_id", "doc_id", "title", "text")) + 8 * chunks.num_rows + extra)


def measure(index: Path, shard: int, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", PROBE, str(index), str(shard)], env=env, capture_output=True,
                         text=True, check=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", required=True)
    ap.add_argument("--baseline-ref", default=None)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_shard_memory.json"))
    a = ap.parse_args()
    index = Path(a.index).resolve()
    trees = {"this tree": str(ROOT)}
    if a.baseline_ref:
        trees[a.baseline_ref] = str(baseline_tree(a.baseline_ref))
    shards = json.loads((index / "manifest.json").read_text())["num_shards"]
    rows = []
    print(f"index {index}")
    print(f"{'tree':<12} {'shard':>5} {'raw MB':>8} {'resident MB':>12} {'resident/raw':>13} {'every row read':>15} "
          f"{'after a filter':>15} {'reported MB':>12}")
    for shard in range(shards):
        raw = raw_bytes(index, shard)
        for name, tree in trees.items():
            r = measure(index, shard, tree)
            rows.append({"tree": name, "shard": shard, "raw": raw, **r})
            all_read = "" if r["resident_all_read"] is None else f"{r['resident_all_read'] / raw:.2f}x"
            filtered = "" if r.get("resident_filtered") is None else f"{r['resident_filtered'] / raw:.2f}x"
            print(f"{name:<12} {shard:>5} {raw / 1e6:>8.2f} {r['resident'] / 1e6:>12.2f} "
                  f"{r['resident'] / raw:>12.2f}x {all_read:>15} {filtered:>15} {r['reported'] / 1e6:>12.2f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"index": str(index), "rows": rows}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
