"""Embedding stage throughput: the pipeline's Ray Data actor-pool stage vs a plain
`SentenceTransformer.encode` of the same texts, in the same run.

The stage is `qrag_ray.pipeline._embed` (the exact function `qrag index` calls) over rows shaped like the
pipeline's vector rows. Three figures per run:
  - plain encode (model already loaded), texts/s — the baseline; measured before and after the stage
    and averaged, because this machine is shared and its load drifts;
  - stage end to end, texts/s — includes starting the actor and loading the model in it;
  - stage steady state, texts/s — end to end minus the fixed cost of a tiny run (actor start + model
    load + Ray Data scheduling), i.e. what the stage sustains on a large corpus.
The ratio target (issue 2) is >= 0.9 of the baseline.

    python benchmarks/bench_embedding.py                 # pydoc topics (ships with Python), all sentences
    python benchmarks/bench_embedding.py --input corpus.jsonl --limit 5000 --out runs/bench_embedding.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def corpus_texts(path: str | None, limit: int) -> tuple[list[str], str]:
    """Sentences and 200-token chunks of a real corpus: the texts atom-sentence/hybrid indexes embed."""
    from qrag_ray.text.chunking import token_windows
    from qrag_ray.text.sentences import split_sentences

    if path:
        docs = [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]
        source = path
    else:
        from pydoc_data.topics import topics

        from qrag_ray.io.pydoc_corpus import unwrap

        docs = [unwrap(topics[k]) for k in sorted(topics)]
        source = "pydoc_data.topics (Python language reference)"
    texts: list[str] = []
    for d in docs:
        texts += token_windows(d, 200, 20)
        texts += split_sentences(d)
    return texts[:limit], source


def rows_table(texts: list[str]):
    import numpy as np
    import pyarrow as pa

    n = len(texts)
    return pa.table({"chunk_idx": pa.array(np.arange(n), pa.int64()), "shard": pa.array(np.zeros(n), pa.int32()),
                     "kind": pa.array(["sentence"] * n), "text": pa.array(texts), "embed_text": pa.array(texts),
                     "qn": pa.array(np.full(n, -1), pa.int32()), "store": pa.array(np.ones(n, bool))})


def run_stage(texts: list[str], cfg) -> tuple[float, "object"]:
    import ray.data

    from qrag_ray.pipeline import _embed

    ds = ray.data.from_arrow(rows_table(texts))
    t0 = time.perf_counter()
    out = _embed(ds, cfg).materialize()
    dt = time.perf_counter() - t0
    assert out.count() == len(texts)
    return dt, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", help="JSONL corpus ({id,text}); default: the pydoc topics")
    ap.add_argument("--limit", type=int, default=4000, help="number of texts")
    ap.add_argument("--batch-size", type=int, default=None, help="encode batch size (default: the config's)")
    ap.add_argument("--out", default="runs/bench_embedding.json")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from qrag_ray.config import EmbedderConfig, IndexConfig
    from qrag_ray.embedding import encode, load_sentence_transformer
    from qrag_ray.runtime import ensure_ray

    texts, source = corpus_texts(args.input, args.limit)
    ecfg = EmbedderConfig() if args.batch_size is None else EmbedderConfig(batch_size=args.batch_size)
    cfg = IndexConfig(embedder=ecfg)
    bs = cfg.embedder.batch_size
    threads = max(1, (os.cpu_count() or 2) // cfg.embedder.actors)  # what the stage gives its actor
    torch.set_num_threads(threads)
    st = load_sentence_transformer(cfg.embedder.model, device="cpu")
    encode(st, texts[:64], bs)  # warm-up

    def plain() -> tuple[float, np.ndarray]:
        t0 = time.perf_counter()
        v = encode(st, texts, bs)
        return time.perf_counter() - t0, v

    base1, ref = plain()
    ensure_ray(None)
    tiny_s, _ = run_stage(texts[:64], cfg)
    stage_s, out = run_stage(texts, cfg)
    base2, _ = plain()
    base_s = (base1 + base2) / 2

    # same vectors as the plain encode (order preserved by chunk_idx)
    got = out.to_pandas()
    vec = np.stack(got.sort_values("chunk_idx")["vector"].to_numpy())
    max_diff = float(np.abs(vec - ref).max())

    n = len(texts)
    steady_s = max(1e-9, stage_s - tiny_s)
    res = {
        "texts": n, "source": source, "mean_chars": round(float(np.mean([len(t) for t in texts])), 1),
        "model": cfg.embedder.model, "batch_size": bs, "torch_threads": threads, "actors": cfg.embedder.actors,
        "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(), "torch": torch.__version__,
        "plain_encode_s": [round(base1, 3), round(base2, 3)],
        "plain_texts_per_s": round(n / base_s, 1),
        "stage_end_to_end_s": round(stage_s, 3), "stage_end_to_end_texts_per_s": round(n / stage_s, 1),
        "stage_fixed_cost_s": round(tiny_s, 3),
        "stage_steady_texts_per_s": round(n / steady_s, 1),
        "ratio_end_to_end": round(base_s / stage_s, 3),
        "ratio_steady": round(base_s / steady_s, 3),
        "max_abs_diff_vs_plain": max_diff,
    }
    rows = [("plain SentenceTransformer.encode", f"{base_s:.2f}", res["plain_texts_per_s"], "1.00"),
            ("Ray Data stage, end to end", f"{stage_s:.2f}", res["stage_end_to_end_texts_per_s"],
             f"{res['ratio_end_to_end']:.2f}"),
            ("Ray Data stage, steady state", f"{steady_s:.2f}", res["stage_steady_texts_per_s"],
             f"{res['ratio_steady']:.2f}")]
    print(f"{n} texts from {source}; {cfg.embedder.model}, batch {bs}, {threads} torch threads, "
          f"load avg {res['load_avg_1m']}")
    print(f"{'':32} {'seconds':>8} {'texts/s':>9} {'ratio':>6}")
    for name, s, tps, r in rows:
        print(f"{name:32} {s:>8} {tps:>9} {r:>6}")
    print(f"stage fixed cost (actor start + model load, 64 texts): {tiny_s:.2f}s; "
          f"max |stage - plain| = {max_diff:.2e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
