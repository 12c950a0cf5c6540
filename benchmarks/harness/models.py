"""The benchmarks' embedders, written to local folders: a tiny randomly initialised sentence-transformers
model, all-MiniLM-L6-v2's shape with random weights, or the bundled MiniLM where its weights are installed.

Scale runs need an embedder that runs the real code path (tokenizer, transformer, pooling, a
`SentenceTransformer` loaded from a folder) at little cost per row; its vectors mean nothing. The
tokenizer is all-MiniLM-L6-v2's, from benchmarks/gpu/minilm-shape (no hub, no weights package: the GPU
machine has neither); the same seed and shape give the same weights, and throughput does not depend on
the weights.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# all-MiniLM-L6-v2's shape without its weights: config, pooling and tokenizer files
MINILM_SHAPE = Path(__file__).resolve().parents[1] / "gpu" / "minilm-shape"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_tiny_model(out: str | Path, hidden: int = 64, layers: int = 2, heads: int = 2, seed: int = 0,
                     max_seq_length: int = 128) -> Path:
    """Write the model folder (idempotent: an existing complete folder is kept) and return its path."""
    out = Path(out)
    if (out / "modules.json").is_file():
        return out
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    src = MINILM_SHAPE
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    hf = tmp / "hf"
    hf.mkdir(parents=True)
    for f in TOKENIZER_FILES:
        shutil.copy2(src / f, hf / f)
    with open(src / "vocab.txt", encoding="utf-8") as f:
        vocab = sum(1 for _ in f)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, max_position_embeddings=512)
    BertModel(cfg).save_pretrained(hf)
    word = models.Transformer(str(hf), max_seq_length=max_seq_length)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    SentenceTransformer(modules=[word, models.Pooling(dim(), pooling_mode="mean")], device="cpu").save(str(tmp / "st"))
    shutil.rmtree(out, ignore_errors=True)
    (tmp / "st").rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def random_init_model(out: Path) -> Path:
    """A sentence-transformers folder of all-MiniLM-L6-v2's shape with seeded random weights (the shipped
    config, pooling and tokenizer files plus freshly initialised BERT weights)."""
    import torch
    from transformers import BertConfig, BertModel

    shutil.copytree(MINILM_SHAPE, out, dirs_exist_ok=True)
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(str(MINILM_SHAPE))).save_pretrained(str(out))
    return out


def pick_model(name: str, random_init: bool, tmp: Path) -> tuple[str, str]:
    """(a model folder or name to load, its description): the bundled `name` unless `random_init` or its
    weights are not installed, else MiniLM's shape with random weights under `tmp`."""
    if not random_init:
        try:
            from qrag_ray.models.bundled import resolve_embedder

            return resolve_embedder(name), name
        except Exception as e:  # the weights package is not installed on a bare GPU box
            print(f"{name} not available ({e}); using a random-init model of its shape")
    os.environ.setdefault("QRAG_ONNX_CACHE", str(tmp / "onnx"))  # a throwaway model's graph goes with it
    return str(random_init_model(tmp / "minilm-shape-random")), "all-MiniLM-L6-v2 shape, random init (seed 0)"
