"""The embedding stage: a callable class for Ray Data `map_batches` with an actor pool.

The model loads once per actor (the constructor), vectors come back L2-normalised float32 so that
FAISS inner product equals cosine similarity everywhere (index, pruning, serving).
"""

from __future__ import annotations

import os

import numpy as np


def load_sentence_transformer(model: str, device: str | None = None, max_seq_length: int | None = None):
    from sentence_transformers import SentenceTransformer

    from qrag_ray.models.registry import resolve_embedder

    if device is None:
        device = "cuda" if _cuda_available() else "cpu"
    st = SentenceTransformer(resolve_embedder(model), device=device)
    if max_seq_length:
        st.max_seq_length = max_seq_length
    return st


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def encode(st, texts: list[str], batch_size: int = 64) -> np.ndarray:
    vecs = st.encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                     convert_to_numpy=True, show_progress_bar=False)
    return np.ascontiguousarray(vecs, dtype=np.float32)


class Embedder:
    """map_batches stage: adds a `vector` column (float32, unit norm) computed from `embed_text`."""

    def __init__(self, model: str, batch_size: int = 64, max_seq_length: int | None = None,
                 threads: int | None = None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.st = load_sentence_transformer(model, max_seq_length=max_seq_length)
        self.batch_size = batch_size

    def __call__(self, batch: dict) -> dict:
        texts = [str(t) for t in batch["embed_text"]]
        batch["vector"] = encode(self.st, texts, self.batch_size) if texts else np.zeros((0, 1), np.float32)
        del batch["embed_text"]
        return batch


def embedder_dim(model: str) -> int:
    st = load_sentence_transformer(model, device="cpu")
    return int(st.get_sentence_embedding_dimension())


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
