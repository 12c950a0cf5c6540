"""How much memory does a loaded shard hold against the raw bytes it stores (this tree against another
commit's with --baseline-ref)?

    python -m benchmarks.shard_memory --index runs/suite-quick/dl19/indexes/chunk+sentence+window \
        [--baseline-ref REF] [--out runs/shard_memory.json]
    python -m benchmarks.shard_memory --tiny           # smoke: the demo's 16 topics (built once), 2 shards

Each shard is loaded by `load_shard` (what `qrag search`, the Router and every ShardSearcher replica
call) in a fresh Python process; resident = that process's RSS after the load minus its RSS before it
(imports done, one Parquet read made), and after every row has been read once (a memory-mapped file's pages all
loaded: the most a shard holds). Raw = the FAISS file (the index as FAISS holds it) + the row
metadata's texts and ids (8-byte chunk key per vector) + the shard's chunks' texts and ids (and their
typed url / metadata columns); with metadata also after a filter on its first field. The
baseline loads the same files from a git worktree of `--baseline-ref` (PYTHONPATH), in its own
process, one after the other. A tree with no known way to open a shard gets a row with its error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.report import write_json

PROBE = r"""
import gc
import json
import sys


def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024


def shard_opener():
    # the tree's own way to open a shard (Shard.open, or an older tree's load_shard), imported here: before
    # the first reading, so the package's imports are not counted as the shard's memory
    try:
        from qrag_ray.search.shard import Shard
    except ImportError:
        pass
    else:
        return Shard.open
    try:
        from qrag_ray.search.shard_search import load_shard
    except ImportError:  # older still: the Serve shard store's loader, which took a third argument
        from qrag_ray.serving.shard_store import load_shard as store_load

        def load_shard(index, number):
            return store_load(index, number, None)
    return load_shard


def text_columns(shard):
    # every row's text and the chunk table's columns, however the tree's shard holds them
    if hasattr(shard, "row_texts"):
        return [shard.row_texts, *shard.chunk_columns]
    chunks = shard.chunks.columns if hasattr(shard.chunks, "columns") else shard.chunks  # a Table, or its columns
    return [shard.index.text, *chunks]


import faiss  # noqa: E402,F401 - imported before the first reading
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet  # noqa: E402

index = sys.argv[1]
# the first Parquet read of a process maps the reader's code and starts its thread pool (~70 MB here,
# once per process, not per shard): done before the first reading
pyarrow.parquet.read_table(index + "/chunks.parquet", columns=["shard"])
try:
    open_shard = shard_opener()
except ImportError as error:
    print(json.dumps({"error": f"no known way to open a shard in this tree ({error})"}))
    sys.exit(0)
gc.collect()
before = rss()
shard = open_shard(index, int(sys.argv[2]))
gc.collect()
after = rss()
try:  # every row's text and every chunk read once: a memory-mapped shard's pages all loaded (the most it holds)
    for column in text_columns(shard):
        pc.sum(pc.utf8_length(column))  # reads every byte (binary_length would read only the offsets)
    read_all = rss() - before
except AttributeError:  # a tree whose shard keeps its texts otherwise
    read_all = None
filtered = None
with open(index + "/manifest.json") as manifest:
    schema = json.load(manifest).get("metadata_schema") or {}
if getattr(shard, "metadata", None) is not None and schema:  # a filter on the first field: its column read
    from qrag_ray.search.filters import compile_filter
    name, typ = next(iter(schema.items()))
    value = {"number": 0, "bool": True, "date": "2000-01-01", "datetime": "2000-01-01"}.get(typ, "")
    selection = shard.select(compile_filter({"type": "ne", "key": name, "value": value}, None, schema))
    gc.collect()
    filtered = rss() - before
print(json.dumps({"resident": after - before, "resident_all_read": read_all, "resident_filtered": filtered,
                  "reported": shard.nbytes}))
"""


def text(column) -> int:
    """The UTF-8 bytes of a column's strings."""
    return sum(len(t.encode()) for t in column.to_pylist() if t)


def raw_bytes(index: Path, shard: int) -> int:
    """What the shard stores: its FAISS file, its rows' texts and keys, its chunks' texts, ids and columns."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from qrag_ray.index.format import read_table_file

    m = json.loads((index / "manifest.json").read_text())
    s = m["shards"][shard]
    meta = read_table_file(index / s["meta"], ["text"])
    chunks = pq.read_table(index / "chunks.parquet", columns=["shard", "chunk_id", "doc_id", "title", "text"])
    chunks = chunks.filter(pc.equal(chunks.column("shard"), shard))
    typed = read_table_file(index / s["chunk_table"]) if s.get("chunk_table") else None  # url / metadata columns
    extra = sum(typed.column(c).nbytes for c in ("url", "metadata") if c in typed.column_names) if typed else 0
    return ((index / s["faiss"]).stat().st_size + text(meta.column("text")) + 8 * meta.num_rows
            + sum(text(chunks.column(c)) for c in ("chunk_id", "doc_id", "title", "text")) + 8 * chunks.num_rows
            + extra)


def measure(index: Path, shard: int, tree: Path) -> dict:
    """The probe in a fresh process with `tree`'s qrag_ray."""
    from benchmarks.harness.trees import tree_env

    out = subprocess.run([sys.executable, "-c", PROBE, str(index), str(shard)], env={**os.environ, **tree_env(tree)},
                         capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ratio(part: int | None, raw: int) -> float | None:
    """`part` / `raw`, or None."""
    return None if part is None else part / raw


def main(argv: list[str] | None = None) -> int:
    """Parse, measure every shard in every tree, print the table and write the report."""
    from benchmarks.harness import trees
    from benchmarks.harness.indexes import demo_index
    from benchmarks.harness.report import print_table

    parser = options.parser(__doc__)
    options.add_common(parser, "shard_memory", baseline=True, workdir=True)
    parser.set_defaults(workdir=str(options.RUNS / "serving_small"))  # serving_small.py's demo index, reused
    parser.add_argument("--index", help="the index whose shards are loaded (default: the demo corpus's, built once)")
    args = parser.parse_args(argv)
    try:
        apps = trees.trees(args.baseline_ref)
    except trees.BaselineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.index:
        index = Path(args.index).resolve()
    else:
        workdir = Path(args.workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        tree = trees.index_builder(apps)
        index = demo_index(workdir, tree, args.tiny, args.baseline_ref if tree != options.ROOT else "")
    shards = json.loads((index / "manifest.json").read_text())["num_shards"]
    rows = []
    for shard in range(shards):
        raw = raw_bytes(index, shard)
        for name, tree in apps.items():
            measured = measure(index, shard, tree)
            rows.append({"tree": args.baseline_ref if name == "base" else "this tree", "shard": shard, "raw": raw,
                         **measured})
    for row in rows:
        if "error" not in row:
            row.update(raw_mb=row["raw"] / 1e6, resident_mb=row["resident"] / 1e6, reported_mb=row["reported"] / 1e6,
                       x_resident=ratio(row["resident"], row["raw"]),
                       x_all_read=ratio(row["resident_all_read"], row["raw"]),
                       x_filtered=ratio(row.get("resident_filtered"), row["raw"]))
    print_table([("tree", "tree", ""), ("shard", "shard", "d"), ("raw MB", "raw_mb", ".2f"),
                 ("resident MB", "resident_mb", ".2f"), ("resident/raw", "x_resident", ".2f"),
                 ("every row read", "x_all_read", ".2f"), ("after a filter", "x_filtered", ".2f"),
                 ("reported MB", "reported_mb", ".2f"), ("error", "error", "")], rows, f"index {index}")
    write_json({"command": options.command(), "index": str(index), "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
