"""Many tenants on a few small indexes: the indexes (each the chunks of every n-th topic of the Python
language reference, 2 shards, one vector per chunk, all built by one `build_index` subprocess), the
tenants file (the documented format `qrag tenants add` writes: name, index, sha256 of the key), the
tenants' bytes and a Zipf draw of which tenant asks next."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import numpy as np

from benchmarks.harness.indexes import build_indexes, write_corpus

TENANT_INDEX = {"representation": "chunk", "shards": 2, "generator.backend": "none", "chunker.method": "token",
                "chunker.size": 200, "chunker.overlap": 20}


def tenant_indexes(workdir: Path, tree: Path, count: int, tiny: bool) -> list[Path]:
    """`count` indexes under `workdir`, index i holding every count-th help topic from i (tiny: of the
    demo's 16 topics only), built once by `tree`."""
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import DEMO_TOPICS

    names = sorted(DEMO_TOPICS if tiny else topics)
    label = "tiny-" if tiny else ""
    specs = []
    for i in range(count):
        corpus = write_corpus(workdir / f"corpus-{label}{i}-of-{count}.jsonl", names[i::count])
        specs.append({"input": str(corpus), "format": "jsonl", **TENANT_INDEX,
                      "build.output": str(workdir / f"index-{label}{i}-of-{count}")})
    build_indexes(tree, specs, workdir)
    return [Path(s["build.output"]) for s in specs]


def index_bytes(index: Path) -> int:
    """The bytes of an index's files: about what its loaded shards hold in a replica's shard cache."""
    return sum(f.stat().st_size for f in index.rglob("*") if f.is_file())


def write_tenants(path: Path, indexes: dict[str, Path]) -> dict[str, str]:
    """A tenants file with one tenant per name (its index), each with a new key: {name: key}. The file
    holds only the keys' sha256, as `qrag tenants add` writes it."""
    import yaml

    keys = {name: "qrag_" + secrets.token_urlsafe(32) for name in indexes}
    entries = [{"name": name, "index": str(index.resolve()),
                "key_sha256": hashlib.sha256(keys[name].encode()).hexdigest()} for name, index in indexes.items()]
    path.write_text(yaml.safe_dump({"tenants": entries}, sort_keys=False))
    return keys


def zipf_ranks(tenants: int, n: int, s: float = 1.1, seed: int = 0) -> np.ndarray:
    """`n` tenant numbers drawn by Zipf(s) rank: a few tenants ask most of the queries."""
    weights = 1.0 / np.arange(1, tenants + 1) ** s
    return np.random.default_rng(seed).choice(tenants, size=n, p=weights / weights.sum())
