"""The embedding benchmarks' texts and model: a real corpus's sentences and chunks, passages and questions
of the sizes asked (from the Python reference that ships with Python), and the model to embed with (the
bundled MiniLM, or a random-init model of its shape where the weights package is not installed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tiny_model import MINILM_SHAPE


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

    shutil.copytree(MINILM_SHAPE, out, dirs_exist_ok=True)
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(str(MINILM_SHAPE))).save_pretrained(str(out))
    return out


def pick_model(name: str, random_init: bool, tmp: Path) -> tuple[str, str]:
    if not random_init:
        try:
            from qrag_ray.models.bundled import resolve_embedder

            return resolve_embedder(name), name
        except Exception as e:  # the weights package is not installed on a bare GPU box
            print(f"{name} not available ({e}); using a random-init model of its shape")
    os.environ.setdefault("QRAG_ONNX_CACHE", str(tmp / "onnx"))  # a throwaway model's graph goes with it
    return str(random_init_model(tmp / "minilm-shape-random")), "all-MiniLM-L6-v2 shape, random init (seed 0)"
