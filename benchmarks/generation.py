"""How fast does the LLM write questions at index time? Question-generation throughput on CPU through the real
pipeline path (`build_index` with the vLLM backend).

For each recipe (`hype`: one prompt per chunk; `atom-question`: one prompt per sentence, the chunk as
context) this runs `build_index` on N chunks with an empty question cache and reads the generation
stage's own counters (requests, prompt/output tokens from vLLM, wall seconds of the stage). The stage's
seconds include starting the vLLM engine (1-2 min on 2 cores), so the same run first measures a baseline:
the same path with ONE chunk and max_tokens=1, i.e. engine start + pipeline overhead. "net" rates
subtract it; "gross" rates are what a user waits for.

    python -m benchmarks.generation --n 20                     # pydoc topics as the corpus
    python -m benchmarks.generation --input chunks.jsonl --n 50 --out runs/gen.json
    python -m benchmarks.generation --tiny       # smoke: 2 chunks, hype only, 16 tokens, no baseline (the
                                                 # engine's start alone takes 1-2 minutes on 2 cores)

Prints a table and writes JSON (default runs/generation.json).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import options

FULL = {"n": 20, "recipes": "hype,atom-question", "max_tokens": 256}
TINY = {"n": 2, "recipes": "hype", "max_tokens": 16}


def pydoc_chunks(n: int, words: int) -> list[dict]:
    """N prose chunks of ~`words` words from the Python reference topics bundled with CPython
    (cut at a sentence end; topics whose opening is mostly code are skipped)."""
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        text = " ".join(re.sub(r"[*=~^-]{3,}", " ", topics[name]).split())  # drop heading underlines
        sents = re.split(r"(?<=[.!?])\s+(?=[A-Z])", text)
        chunk, count = [], 0
        for s in sents:
            if count >= words:
                break
            chunk.append(s)
            count += len(s.split())
        body = " ".join(chunk)
        letters = sum(ch.isalpha() or ch.isspace() for ch in body)
        if count < words // 2 or letters < 0.85 * len(body):
            continue
        out.append({"id": f"pydoc-{name}", "text": body})
        if len(out) == n:
            break
    return out


def read_jsonl(path: str, n: int) -> list[dict]:
    """The first `n` records (id, text) of a JSONL file."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                rows.append({"id": str(d["id"]), "text": d["text"]})
            if len(rows) == n:
                break
    return rows


def run_recipe(docs: list[dict], representation: str, work: Path, max_tokens: int, questions: int,
               batch_size: int) -> dict:
    """One `build_index` of `docs` with an empty question cache: the generation stage's counters and seconds."""
    from qrag_ray.config.index import GeneratorConfig, IndexConfig, SamplingConfig
    from qrag_ray.index.build import build_index

    tag = f"{representation}-{len(docs)}-{max_tokens}"
    corpus = work / f"{tag}.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    cache = work / f"cache-{tag}"  # empty: every request is generated
    shutil.rmtree(cache, ignore_errors=True)
    cfg = IndexConfig(
        input=str(corpus), format="jsonl", representation=representation, shards=1, chunker={"method": "none"},
        build={"output": str(work / f"index-{tag}"), "cache_dir": str(cache), "overwrite": True},
        # the zero-shot per-sentence prompt, as recorded in docs/BENCHMARKS.md (the default is now few-shot)
        generator=GeneratorConfig(backend="vllm", questions=questions, atom_prompt="atom-question",
                                  questions_per_atom=1, batch_size=batch_size,
                                  sampling=SamplingConfig(max_tokens=max_tokens)),
    )
    t0 = time.perf_counter()
    report = build_index(cfg)
    g = report.generation
    return {
        "recipe": representation, "chunks": report.chunks, "requests": g.requests, "generated": g.generated,
        "prompt_tokens": g.prompt_tokens, "output_tokens": g.output_tokens, "questions": report.questions,
        "generate_seconds": round(report.stage_seconds.get("generate", g.seconds), 2),
        "build_seconds": round(time.perf_counter() - t0, 2), "max_tokens": max_tokens,
    }


def derive(row: dict, baseline_s: float) -> dict:
    """Rates from the stage's counters. Net figures subtract the baseline; they are None when the run took
    less than the baseline (engine start varies by minutes on a loaded shared box), never nonsense."""
    s = row["generate_seconds"]
    net = s - baseline_s if baseline_s and s - baseline_s > 0.1 * s else None

    def rate(x, t):
        """`x` per `t`, or None without a time."""
        return round(x / t, 2) if t else None

    row |= {
        "output_tok_s": rate(row["output_tokens"], s), "prompt_tok_s": rate(row["prompt_tokens"], s),
        "net_seconds": round(net, 2) if net else None,
        "net_output_tok_s": rate(row["output_tokens"], net), "net_prompt_tok_s": rate(row["prompt_tokens"], net),
        "s_per_chunk": rate(s, max(row["chunks"], 1)),
        "net_s_per_chunk": rate(net, max(row["chunks"], 1)) if net else None,
        "s_per_question": rate(s, row["questions"]) if row["questions"] else None,
        "net_s_per_question": rate(net, row["questions"]) if row["questions"] and net else None,
    }
    return row


def print_table(rows: list[dict], baseline: dict) -> None:
    """The recipes' rows and the baseline's seconds."""
    cols = [("recipe", "recipe"), ("chunks", "chunks"), ("requests", "req"), ("questions", "questions"),
            ("prompt_tokens", "prompt tok"), ("output_tokens", "output tok"), ("generate_seconds", "s"),
            ("output_tok_s", "out tok/s"), ("prompt_tok_s", "prompt tok/s"), ("s_per_chunk", "s/chunk"),
            ("s_per_question", "s/question"), ("net_output_tok_s", "net out tok/s"),
            ("net_s_per_chunk", "net s/chunk"), ("net_s_per_question", "net s/question")]
    table = [[h for _, h in cols]] + [[str(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(cols))]
    for i, r in enumerate(table):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"baseline (engine start + pipeline, 1 chunk, max_tokens=1): {baseline['generate_seconds']} s; "
          "net = gross minus baseline")


def main(argv: list[str] | None = None) -> int:
    """Parse, run the baseline and every recipe, print and write the report."""
    parser = options.parser(__doc__)
    options.add_common(parser, "generation")
    parser.add_argument("--n", type=int, help="chunks (full 20)")
    parser.add_argument("--input", help="JSONL with id, text (default: pydoc topics)")
    parser.add_argument("--recipes", help="comma list (full: hype,atom-question)")
    parser.add_argument("--chunk-words", type=int, default=80, help="words per pydoc chunk")
    parser.add_argument("--max-tokens", type=int, help="full: 256")
    parser.add_argument("--questions", type=int, default=10, help="questions per chunk prompt (hype)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--no-baseline", action="store_true", help="skip the engine-start baseline run")
    args = options.sized(parser.parse_args(argv), FULL, TINY)
    args.no_baseline = args.no_baseline or args.tiny

    docs = read_jsonl(args.input, args.n) if args.input else pydoc_chunks(args.n, args.chunk_words)
    if not docs:
        print("no input chunks", file=sys.stderr)
        return 2
    from qrag_ray.runtime.ray_start import ensure_ray

    ensure_ray(None, None)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="qrag-bench-gen-"))
    try:
        baseline = {"generate_seconds": 0.0}
        if not args.no_baseline:
            baseline = run_recipe(docs[:1], "hype", work, 1, 1, args.batch_size)
            print(f"baseline: {baseline}", file=sys.stderr)
        rows = []
        for rec in [r.strip() for r in args.recipes.split(",") if r.strip()]:
            row = derive(run_recipe(docs, rec, work, args.max_tokens, args.questions, args.batch_size),
                         baseline["generate_seconds"])
            print(f"{rec}: {row}", file=sys.stderr)
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, baseline)
    import ray
    import vllm

    result = {
        "benchmark": "question generation, vLLM backend through build_index",
        "model": "qwen2.5-coder-0.5b-instruct (bf16, from the bundled GGUF)",
        "corpus": args.input or f"pydoc topics, {args.chunk_words}-word chunks", "n_chunks": len(docs),
        "baseline": baseline, "results": rows,
        "env": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                "vllm": vllm.__version__, "ray": ray.__version__, "loadavg_before": load_before,
                "loadavg_after": os.getloadavg()},
        "command": options.command(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
