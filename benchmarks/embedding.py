"""The embedding stage: how fast does it run, where does the time go, and what do the faster choices (ONNX
Runtime, a narrower dtype) cost? One question, four modes:

    python -m benchmarks.embedding --mode stage --device cpu        # the build's stage, piece by piece
    python -m benchmarks.embedding --mode stage --device cpu --shards 32 --file-latency-ms 20
    python -m benchmarks.embedding --mode stage --device cuda       # full size: benchmarks/gpu/run.sh
    python -m benchmarks.embedding --mode backend --threads 1       # torch vs ONNX Runtime on CPU
    python -m benchmarks.embedding --mode precision --squad dev-v1.1.json --contexts 300
    python -m benchmarks.embedding --mode rate --texts 1000         # MiniLM texts/s and per CPU second
    python -m benchmarks.embedding --mode MODE --tiny               # smoke size of any mode

Mode `stage`, the classes `qrag index` runs (`Tokenize`, the CPU workers' UDF; `EmbedSink`, the embedding
actor's: row keys, the forward step, the Parquet parts) on passages (~90 tokens) and questions (~20),
each row printed as it is measured:
  - today: `encode_canonical` (at most 64 rows and 512 tokens per pass, float32), the CPU build's encode;
  - rows64 (CPU only): the same with 64 rows of any length per pass (`x today` < 1: how much slower);
  - ceiling: `Forward.embed` over token batches already on the device, at each --tokens-per-batch; `ratio`
    of every row = its rate / the best ceiling of its dtype;
  - forward: the sink's own `Forward` over `Tokenize`'s batches (host arrays in, vectors out);
  - EmbedSink: the same batches through a real `EmbedSink`, `EmbedSink.CONCURRENCY` calls at a time as Ray
    Data calls it (parts written to a temporary work dir over --shards shards); `vs fwd` = its rate / the
    forward row's; `files/b` = checkpoint files per batch;
  - stage: `Tokenize` in the pipeline's number of worker processes feeding the EmbedSink, texts in, parts
    out. `max|diff|`: largest difference from today's float32 vectors.
--file-latency-ms MS: every checkpoint file waits MS first (a network filesystem's round trip), injected
where every checkpoint write passes (qrag_ray.index.format.atomic_write). It needs torch, transformers and
sentence-transformers (no Ray, FAISS, vLLM); the EmbedSink rows also pyarrow, pydantic and pyyaml. Without
the bundled MiniLM weights it embeds with a random-init model of MiniLM's shape and its real tokenizer
(benchmarks/gpu/minilm-shape/): throughput does not depend on weights.

Mode `backend`: torch against ONNX Runtime, same model and texts, alternating block by block: one query at a
time (`encode`, what the Router and `qrag search` run) and batches of sentences and chunks
(`encode_canonical`, what `qrag index` runs), and the largest difference between their vectors.
Mode `precision`: the real MiniLM on CPU per dtype against float32: nDCG@10 / R@1 / MRR@10 of exact cosine
search and how far the vectors move; SQuAD dev's first --contexts contexts and their questions with
--squad, else each passage of the Python reference found by its first sentence. CPU bfloat16/float16 round
like a GPU's do (TF32 is CUDA only, and closer to float32 than both).
Mode `rate`: MiniLM's `encode` on --texts question-length texts: texts per second and per CPU second (the
stable figure on a shared machine, and the one that scales with cores).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.report import print_table, write_json

MODES = ("stage", "backend", "precision", "rate")
FULL = {"passages": 100000, "questions": 100000, "rows_per_batch": 4096, "texts": 1024, "queries": 200, "rounds": 3,
        "contexts": 300}
FULL_CPU = {**FULL, "passages": 256, "questions": 256}  # a CPU's stage run: minutes on 2 cores
TINY = {"passages": 16, "questions": 16, "rows_per_batch": 16, "texts": 64, "queries": 8, "rounds": 1, "contexts": 20}


def parse(argv: list[str] | None):
    """The options, with the full (per device) or tiny sizes and the report's path per mode."""
    parser = options.parser(__doc__)
    options.add_common(parser, "embedding", queries=True, rounds=True)
    parser.add_argument("--mode", choices=MODES, default="stage")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: CUDA where torch sees it")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--threads", type=int, help="torch / ONNX Runtime threads (stage: CPUs - workers; else 1)")
    parser.add_argument("--dtypes", help="comma list (stage on CUDA: float32,tf32,bfloat16,float16; stage on CPU: "
                                     "float32,bfloat16; precision: float32,bfloat16,float16; tiny: float32, "
                                     "precision float32,bfloat16)")
    stage = parser.add_argument_group("mode stage")
    stage.add_argument("--passages", type=int, help="passages to embed (CUDA 100000, CPU 256)")
    stage.add_argument("--questions", type=int, help="questions to embed (CUDA 100000, CPU 256)")
    stage.add_argument("--today-limit", type=int, default=20000, help="texts per workload for today's slower path")
    stage.add_argument("--tokens-per-batch", default="65536", help="comma list; the ceiling at each, the rest at the "
                                                                   "first")
    stage.add_argument("--workers", type=int, help="tokenizer processes (default: the pipeline's, CPUs - 2, >= 1)")
    stage.add_argument("--rows-per-batch", type=int, help="rows per batch (the pipeline's build.rows_per_part)")
    stage.add_argument("--shards", type=int, default=4, help="shards the sink's rows go to (the build's --shards)")
    stage.add_argument("--file-latency-ms", type=float, default=0.0, help="a slow filesystem: each checkpoint file "
                                                                          "waits this long before it is written")
    stage.add_argument("--random-init", action="store_true", help="the MiniLM-shape random-init model even where "
                                                                  "the weights are installed")
    other = parser.add_argument_group("modes backend, precision, rate")
    other.add_argument("--texts", type=int, help="texts per batch block (backend) or to embed (rate)")
    other.add_argument("--squad", help="precision: SQuAD v1.1 dev JSON (default: the Python reference)")
    other.add_argument("--contexts", type=int, help="precision: contexts (passages) searched")
    parser.set_defaults(out=None)
    args = parser.parse_args(argv)
    args.out = args.out or str(options.RUNS / f"embedding_{args.mode}.json")
    if args.device == "auto":
        try:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:  # main() says what is missing
            args.device = "cpu"
    return options.sized(args, FULL if args.device == "cuda" else FULL_CPU, TINY)


def stage(args) -> int:
    """Mode stage: a warmed pool of tokenizer processes, then every row (harness/embed_stage.py)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    import numpy as np

    from benchmarks.harness.embed_stage import run_stage, tokenize_batch, worker_init
    from benchmarks.harness.models import pick_model

    cpus = os.cpu_count() or 2
    full = "float32,tf32,bfloat16,float16" if args.device == "cuda" else "float32,bfloat16"
    dtypes = (args.dtypes or ("float32" if args.tiny else full)).split(",")
    tpbs = [int(x) for x in args.tokens_per_batch.split(",")]
    workers = args.workers or max(1, cpus - 2)  # the pipeline's: CPUs - the embedding actor - the driver
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_path, model_name = pick_model(args.model, args.random_init, Path(tmp))
        # the pool starts (spawn) before CUDA is touched, and is warmed so its start-up is not timed
        pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=worker_init,
                                   initargs=(model_path,))
        list(pool.map(tokenize_batch, [(np.arange(1), ["warm up"])] * workers * 2))
        try:
            run_stage(args, pool, model_path, model_name, args.passages, args.questions, dtypes, tpbs, workers, cpus,
                      Path(tmp))
        finally:
            pool.shutdown()
    print(f"wrote {args.out}", flush=True)
    return 0


def backend(args) -> dict:
    """Mode backend: torch and ONNX Runtime block by block, query latency and build rate."""
    import numpy as np
    import torch

    from benchmarks.harness.embed_stage import corpus_texts
    from qrag_ray.embedding import encode, encode_canonical, load_sentence_transformer
    from qrag_ray.embedding.onnx import backend_of

    threads = args.threads or 1
    torch.set_num_threads(threads)
    models = {b: load_sentence_transformer(args.model, device="cpu", backend=b, threads=threads)
              for b in ("torch", "onnx")}
    if backend_of(models["onnx"]) != "onnx":
        raise SystemExit("error: ONNX Runtime is not available here")
    texts, source = corpus_texts(None, args.texts)
    queries = [t[:80] for t in texts[:args.queries]]
    query_ms: dict[str, list[float]] = {b: [] for b in models}
    rate: dict[str, list[float]] = {b: [] for b in models}
    for st in models.values():  # warm-up
        encode(st, queries[:4])
        encode_canonical(st, texts[:64])
    for _ in range(args.rounds):
        for name, st in models.items():
            for query in queries:
                start = time.perf_counter()
                encode(st, [query])
                query_ms[name].append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            encode_canonical(st, texts)
            rate[name].append(len(texts) / (time.perf_counter() - start))
    diff = max(float(np.abs(encode_canonical(models["torch"], texts[:256])
                            - encode_canonical(models["onnx"], texts[:256])).max()),
               float(np.abs(encode(models["torch"], queries) - encode(models["onnx"], queries)).max()))
    rows = [{"backend": b, "query_p50_ms": statistics.median(query_ms[b]),
             "query_p90_ms": float(np.percentile(query_ms[b], 90)), "build_texts_per_s": statistics.median(rate[b])}
            for b in models]
    print_table([("backend", "backend", ""), ("query p50 ms", "query_p50_ms", ".2f"),
                 ("query p90 ms", "query_p90_ms", ".2f"), ("build texts/s", "build_texts_per_s", ".1f")], rows,
                f"{args.model}, {threads} threads, {len(texts)} texts, {len(queries)} queries, max |diff| {diff:.1e}")
    return {"model": args.model, "threads": threads, "source": source, "texts": len(texts), "queries": len(queries),
            "rounds": args.rounds, "backends": rows, "max_abs_diff": diff}


def squad(path: str, contexts: int) -> tuple[list[str], list[str], list[int]]:
    """(contexts, questions, the context index each question was written for)."""
    import json

    ctx, questions, gold = [], [], []
    for article in json.loads(Path(path).read_text())["data"]:
        for paragraph in article["paragraphs"]:
            if len(ctx) == contexts:
                return ctx, questions, gold
            ctx.append(paragraph["context"])
            for qa in paragraph["qas"]:
                questions.append(qa["question"])
                gold.append(len(ctx) - 1)
    return ctx, questions, gold


def first_sentences(contexts: int) -> tuple[list[str], list[str], list[int]]:
    """Passages of the Python reference, each searched for by its own first sentence."""
    from benchmarks.harness.embed_stage import workloads
    from qrag_ray.text.sentences import split_sentences

    passages = list(dict.fromkeys(workloads(contexts * 2, 0)["passages"]))[:contexts]
    return passages, [split_sentences(p)[0] for p in passages], list(range(len(passages)))


def precision(args) -> dict:
    """Mode precision: ranking quality and vector drift per dtype against float32."""
    import numpy as np
    import torch

    from qrag_ray.embedding import Forward, load_sentence_transformer
    from qrag_ray.embedding.tokens import token_ids
    from qrag_ray.evaluation.metrics import mrr_at_k, ndcg_at_k, recall_at_k

    torch.set_num_threads(args.threads or 1)
    ctx, questions, gold = squad(args.squad, args.contexts) if args.squad else first_sentences(args.contexts)
    qrels = {str(i): {str(g): 1} for i, g in enumerate(gold)}
    rows, reference = [], None
    for dtype in (args.dtypes or ("float32,bfloat16" if args.tiny else "float32,bfloat16,float16")).split(","):
        st = load_sentence_transformer(args.model, device="cpu", dtype=dtype, backend="torch")
        forward = Forward(st, tokens_per_batch=8192)
        start = time.perf_counter()
        vec = {name: forward(*token_ids(st.tokenizer, texts, int(st.max_seq_length)))
               for name, texts in (("contexts", ctx), ("questions", questions))}
        seconds = time.perf_counter() - start
        top = np.argsort(-(vec["questions"] @ vec["contexts"].T), axis=1, kind="stable")[:, :10]
        run = {str(i): [str(d) for d in row] for i, row in enumerate(top)}
        row = {"dtype": dtype, "nDCG@10": ndcg_at_k(run, qrels, 10), "R@1": recall_at_k(run, qrels, 1),
               "MRR@10": mrr_at_k(run, qrels, 10), "seconds": round(seconds, 1)}
        if reference is None:
            reference = (vec, top)
        else:
            both = np.concatenate([vec["contexts"], vec["questions"]])
            base = np.concatenate([reference[0]["contexts"], reference[0]["questions"]])
            row |= {"max_abs_diff": float(np.abs(both - base).max()), "min_cosine": float((both * base).sum(1).min()),
                    "top1_same": float(np.mean(top[:, 0] == reference[1][:, 0])),
                    "top10_same_set": float(np.mean([set(x) == set(y) for x, y in zip(top, reference[1],
                                                                                       strict=True)]))}
        rows.append(row)
    print_table([("dtype", "dtype", ""), ("nDCG@10", "nDCG@10", ".4f"), ("R@1", "R@1", ".4f"),
                 ("MRR@10", "MRR@10", ".4f"), ("s", "seconds", ".1f"), ("max|diff|", "max_abs_diff", ".1e"),
                 ("min cos", "min_cosine", ".5f"),
                 ("top1 same", "top1_same", ".3f"), ("top10 same", "top10_same_set", ".3f")], rows,
                f"{len(ctx)} contexts, {len(questions)} questions ({args.squad or 'the Python reference'})")
    return {"source": args.squad or "pydoc_data.topics", "contexts": len(ctx), "questions": len(questions),
            "dtypes": rows}


def rate(args) -> dict:
    """MiniLM's `encode` on question-length sentences of the Python reference (repeated past its ~10k)."""
    from pydoc_data.topics import topics

    from qrag_ray.embedding import encode, load_sentence_transformer
    from qrag_ray.text.sentences import split_sentences

    st = load_sentence_transformer(args.model, device="cpu")
    pool = [x for t in sorted(topics) for x in split_sentences(topics[t].replace("\n", " ")) if 20 <= len(x) <= 120]
    texts = (pool * (args.texts // len(pool) + 1))[:args.texts]
    encode(st, texts[:64], 64)  # warm-up
    start = time.perf_counter()
    cpu0 = time.process_time()
    encode(st, texts, 128)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    row = {"texts": len(texts), "distinct_texts": len(set(texts)),
           "mean_chars": round(sum(map(len, texts)) / len(texts), 1), "texts_per_s": round(len(texts) / wall, 1),
           "texts_per_cpu_s": round(len(texts) / cpu, 1),
           "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2)}
    print_table([(k, k, "") for k in row], [row], f"{args.model} encode, batch 128")
    return {"model": args.model, **row}


def main(argv: list[str] | None = None) -> int:
    """Check the dependencies, run the mode, write its report."""
    from benchmarks.harness.embed_stage import missing

    args = parse(argv)
    if gone := missing("numpy", "torch", "transformers", "sentence_transformers"):
        print(f"error: the embedding benchmark needs {', '.join(gone)} (pip install {' '.join(gone)})", flush=True)
        return 2
    if args.mode == "stage":
        return stage(args)
    measured = {"backend": backend, "precision": precision, "rate": rate}[args.mode](args)
    write_json({"command": options.command(), "mode": args.mode, "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "load_avg": os.getloadavg(), **measured}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
