"""Loading the embedder: device, precision and backend, and the plain (query-side) encode."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import numpy as np

from qrag_ray.errors import QragError
from qrag_ray.models.bundled import resolve_embedder

logger = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "tf32", "bfloat16", "float16")


def resolve_dtype(dtype: str, device: str) -> str:
    """`auto` is float32 on CPU and bfloat16 on CUDA (float32's rankings, faster, cannot overflow;
    docs/BENCHMARKS.md). tf32 is a CUDA matmul mode: on CPU it is refused rather than ignored."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown embedder dtype {dtype!r} (one of {', '.join(DTYPES)})")
    cuda = str(device).startswith("cuda")
    if dtype == "auto":
        return "bfloat16" if cuda else "float32"
    if dtype == "tf32" and not cuda:
        raise ValueError("embedder dtype tf32 needs a CUDA device (on CPU use float32 or bfloat16)")
    return dtype


def load_sentence_transformer(model: str, device: str | None = None, max_seq_length: int | None = None,
                              backend: str = "auto", threads: int | None = None, dtype: str = "float32"):
    """device None: CUDA when there is one. dtype: see `resolve_dtype`. backend: "torch"; "onnx" (CPU,
    float32; QragError when the model cannot run there); "auto": ONNX Runtime on CPU in float32 when it
    is installed and the model exports and agrees with torch, else torch (qrag_ray/embedding/onnx.py)."""
    import torch
    from sentence_transformers import SentenceTransformer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    resolved_dtype = resolve_dtype(dtype, device)
    transformer = SentenceTransformer(resolve_embedder(model), device=device)
    if max_seq_length:
        transformer.max_seq_length = max_seq_length
    if resolved_dtype in ("bfloat16", "float16"):
        transformer.to(getattr(torch, resolved_dtype))
    # tf32 keeps float32 weights and is switched on around each encode (`precision`)
    transformer._qrag_dtype = resolved_dtype
    if backend == "onnx" or (backend == "auto" and device == "cpu" and resolved_dtype == "float32"):
        from qrag_ray.embedding.onnx import OnnxUnavailable, use_onnx

        try:
            if resolved_dtype != "float32":
                raise OnnxUnavailable(f"the ONNX backend runs float32 only, not {resolved_dtype}")
            use_onnx(transformer, threads)
        except OnnxUnavailable as error:
            if backend == "onnx":
                raise QragError(f"embedder backend onnx: {error}") from None
            logger.info("embedder %s stays on torch: %s", model, error)
    elif backend not in ("auto", "torch"):
        raise ValueError(f"unknown embedder backend {backend!r}")
    return transformer


@contextlib.contextmanager
def precision(model) -> Iterator[None]:
    """TF32 matmuls while `model` encodes, when it was loaded with dtype tf32. torch's switch is per
    process, so it is restored after the call: another model in the same process keeps float32."""
    if getattr(model, "_qrag_dtype", "float32") != "tf32":
        yield
        return
    import torch

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def encode(model, texts: list[str], batch_size: int = 64) -> np.ndarray:
    with precision(model):
        vecs = model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)
    return np.ascontiguousarray(vecs, dtype=np.float32)


def embedding_dim(model) -> int:
    get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(get())


def embedder_dim(model: str) -> int:
    return embedding_dim(load_sentence_transformer(model, device="cpu"))
