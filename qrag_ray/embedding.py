"""The embedding stage: a callable class for Ray Data `map_batches` with an actor pool.

The model loads once per actor (the constructor), vectors come back L2-normalised float32 so that
FAISS inner product equals cosine similarity everywhere (index, pruning, serving).
"""

from __future__ import annotations

import logging
import os

import numpy as np

logger = logging.getLogger(__name__)


def load_sentence_transformer(model: str, device: str | None = None, max_seq_length: int | None = None,
                              backend: str = "auto", threads: int | None = None):
    """backend: "torch"; "onnx" (CPU; raises QragError when the model cannot run there); "auto": ONNX
    Runtime on CPU when it is installed and the model exports and agrees with torch, else torch
    (qrag_ray/onnx_backend.py says why)."""
    from sentence_transformers import SentenceTransformer

    from qrag_ray.models.registry import resolve_embedder

    if device is None:
        device = "cuda" if _cuda_available() else "cpu"
    st = SentenceTransformer(resolve_embedder(model), device=device)
    if max_seq_length:
        st.max_seq_length = max_seq_length
    if backend == "onnx" or (backend == "auto" and device == "cpu"):
        from qrag_ray.onnx_backend import OnnxUnavailable, use_onnx

        try:
            use_onnx(st, threads)
        except OnnxUnavailable as e:
            if backend == "onnx":
                from qrag_ray.errors import QragError

                raise QragError(f"embedder backend onnx: {e}") from None
            logger.info("embedder %s stays on torch: %s", model, e)
    elif backend not in ("auto", "torch"):
        raise ValueError(f"unknown embedder backend {backend!r}")
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


def encode_canonical(st, texts: list[str], micro_batch: int = 32, bucket: int = 16) -> np.ndarray:
    """Like `encode`, but each text's vector does not depend on which other texts share its batch.

    Why: a resumed build embeds a different mix of rows per batch than an uninterrupted one, and
    BLAS results move in the last bits with the padded length and the batch shape (measured: up to
    2.6e-7 on MiniLM), which changes the FAISS files' checksums. Here a text is padded to a length
    bucket decided by its own token count, and every forward pass has exactly `micro_batch` rows
    (short groups are filled with copies), so the shapes, and with them the numbers, are fixed per
    text. Costs a little padding; equal to `encode` within ~2e-7."""
    import torch

    texts = [str(t) for t in texts]
    tok = getattr(st, "tokenizer", None)
    if not texts or tok is None:
        return encode(st, texts, micro_batch)
    limit = int(st.max_seq_length or 512)
    enc = tok(texts, truncation=True, max_length=limit)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
    lens = np.asarray([len(x) for x in enc["input_ids"]])
    padded = np.minimum(-(-lens // bucket) * bucket, limit)
    dim = st.get_embedding_dimension() if hasattr(st, "get_embedding_dimension") else st.get_sentence_embedding_dimension()
    out = np.zeros((len(texts), dim), np.float32)
    for length in np.unique(padded):
        idx = np.flatnonzero(padded == length)
        for s in range(0, len(idx), micro_batch):
            grp = idx[s:s + micro_batch].tolist()
            n = len(grp)
            grp += [grp[0]] * (micro_batch - n)
            feats = tok.pad({k: [enc[k][i] for i in grp] for k in keys}, padding="max_length",
                            max_length=int(length), return_tensors="pt")
            feats = {k: v.to(st.device) for k, v in feats.items()}
            with torch.inference_mode():
                e = st.forward(feats)["sentence_embedding"].float()
            e = torch.nn.functional.normalize(e, p=2, dim=1).cpu().numpy()
            out[idx[s:s + n]] = e[:n]
    return out


class Embedder:
    """map_batches stage: adds a `vector` column (float32, unit norm) computed from `embed_text`."""

    def __init__(self, model: str, batch_size: int = 64, max_seq_length: int | None = None,
                 threads: int | None = None, backend: str = "auto"):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.st = load_sentence_transformer(model, max_seq_length=max_seq_length, backend=backend, threads=threads)
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
