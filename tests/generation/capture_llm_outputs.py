"""Capture real Qwen2.5-Coder-0.5B replies to the per-sentence prompts into tests/data/llm_outputs/.

Not a test: run it by hand when the prompts change, then update the pinned expectations in
test_parsing.py. It uses the same engine and sampling the index build uses (vLLM CPU, greedy,
repetition penalty 1.1, max_tokens 256), so the files are what the parser meets in production.

    python tests/generation/capture_llm_outputs.py            # writes qwen05b_atom_*.txt

Each reply is written verbatim (no strip), so trailing newlines / cut-off tails stay as produced.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "llm_outputs"

BERLIN = (
    "Berlin is the capital and largest city of Germany, by both area and population. With 3.7 million "
    "inhabitants it is the most populous city of the European Union within its city limits. Berlin is "
    "surrounded by the state of Brandenburg."
)
BERLIN_ATOMS = [
    "Berlin is the capital and largest city of Germany, by both area and population.",
    "With 3.7 million inhabitants it is the most populous city of the European Union within its city limits.",
    "Berlin is surrounded by the state of Brandenburg.",
]
TESLA = (
    "Tesla Motors was founded in July 2003 by Martin Eberhard and Marc Tarpenning. Elon Musk led the "
    "Series A funding round in February 2004 and became chairman of the board."
)
TESLA_ATOM = "Elon Musk led the Series A funding round in February 2004 and became chairman of the board."

# (file stem, prompt, atom, chunk, n)
CASES = [
    ("qwen05b_atom_question_berlin_1", "atom-question", BERLIN_ATOMS[0], BERLIN, 1),
    ("qwen05b_atom_question_berlin_2", "atom-question", BERLIN_ATOMS[1], BERLIN, 1),
    ("qwen05b_atom_question_tesla_n3", "atom-question", TESLA_ATOM, TESLA, 3),
    ("qwen05b_atom_fewshot_berlin_3", "atom-question-fewshot", BERLIN_ATOMS[2], BERLIN, 1),
    ("qwen05b_atom_fewshot_tesla_n3", "atom-question-fewshot", TESLA_ATOM, TESLA, 3),
]


def main() -> int:
    from qrag_ray.config.llm import GeneratorConfig
    from qrag_ray.generation.chat import get_chat_model
    from qrag_ray.generation.prompts import get_prompt

    cfg = GeneratorConfig(backend="vllm")
    started = time.perf_counter()
    model = get_chat_model(cfg).start()
    print(f"engine ready in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    try:
        for stem, prompt, atom, chunk, count in CASES:
            msgs = get_prompt(prompt).render(atom, n=count, context=chunk)
            call_started = time.perf_counter()
            raw = model.complete(msgs, max_tokens=cfg.sampling.max_tokens, temperature=cfg.sampling.temperature)
            (OUT / f"{stem}.txt").write_text(raw)
            print(json.dumps({"file": stem, "seconds": round(time.perf_counter() - call_started, 1), "raw": raw}),
                  file=sys.stderr)
    finally:
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
