"""Embedding: texts -> L2-normalised float32 vectors (FAISS inner product = cosine everywhere). `load`:
the model and `encode` (queries, evaluation); `tokens`: tokenization as its own CPU step; `forward`: the
model's step over token arrays and `encode_canonical`, the batch-invariant encode of every CPU build."""

from __future__ import annotations

import os

from qrag_ray.embedding.forward import Forward, encode_canonical
from qrag_ray.embedding.load import embedder_dim, encode, load_sentence_transformer, resolve_dtype
from qrag_ray.embedding.tokens import Tokenize

__all__ = ["Forward", "Tokenize", "embedder_dim", "encode", "encode_canonical", "load_sentence_transformer",
           "resolve_dtype"]

# One tokenizer thread per process: builds run many processes and Rust's own pool oversubscribes the cores.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
