"""Embedding: texts -> L2-normalised float32 vectors, so that FAISS inner product equals cosine
similarity everywhere (index, pruning, serving).

- `load`: the model on its device, precision and backend; `encode` (queries, evaluation).
- `tokens`: tokenization as its own CPU step (`Tokenize`, a map_batches UDF).
- `forward`: the model's step over token arrays (`Forward`, the GPU actor's work) and
  `encode_canonical`, the batch-invariant encode every CPU build uses.
"""

from __future__ import annotations

import os

from qrag_ray.embedding.forward import Forward, encode_canonical
from qrag_ray.embedding.load import Embedder, embedder_dim, encode, load_sentence_transformer, resolve_dtype
from qrag_ray.embedding.tokens import Tokenize

__all__ = ["Embedder", "Forward", "Tokenize", "embedder_dim", "encode", "encode_canonical",
           "load_sentence_transformer", "resolve_dtype"]

# One tokenizer thread per process: builds run many processes (Ray workers, tokenizing tasks) and
# Rust's own thread pool on top of them oversubscribes the cores.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
