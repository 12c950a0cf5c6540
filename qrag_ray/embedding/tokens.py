"""Tokenization as its own step: texts -> fixed-width token id arrays and lengths, sorted by length.

Why apart from the forward pass: on a GPU the forward pass of a small encoder is many times faster
than one host thread can tokenize, so the model's actor must not tokenize. This step runs wherever
CPUs are (Ray Data tasks or a CPU actor pool, a process pool in the benchmark) and hands the forward
step (`forward.py`) arrays it only has to slice and stack: every row is padded to the model's maximum
length, so the column has one shape in every block and survives Ray Data re-batching, and the lengths
come along so the forward step pads only to each row's bucket.

The ids equal what the model's own tokenizer call `tok(texts, truncation=True, max_length=limit)` gives
(the canonical encode pads those), which is what keeps CPU vectors unchanged.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import numpy as np

BUCKET = 16  # rows are padded to a multiple of this many tokens (the canonical encode's buckets)


def token_ids(tok, texts: list[str], limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [n, limit], lengths int32 [n]): each text truncated to `limit` tokens with the special
    tokens, padded with the pad id on the tokenizer's padding side."""
    texts = [str(t) for t in texts]
    if getattr(tok, "is_fast", False):
        # the Rust tokenizer straight: the Python wrapper's per-call bookkeeping costs more than the
        # tokenization of short texts
        rust = tok.backend_tokenizer
        rust.no_padding()
        rust.enable_truncation(limit, direction=tok.truncation_side)
        seqs = [e.ids for e in rust.encode_batch(texts)] if texts else []
    else:
        seqs = tok(texts, truncation=True, max_length=limit)["input_ids"] if texts else []
    lens = np.fromiter((len(s) for s in seqs), np.int32, len(seqs))
    ids = np.full((len(seqs), limit), tok.pad_token_id or 0, np.int32)
    cols = np.arange(limit)
    mask = cols < lens[:, None] if tok.padding_side == "right" else cols >= limit - lens[:, None]
    ids[mask] = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(lens.sum()))
    return ids, lens


def padded_lengths(lens: np.ndarray, limit: int, bucket: int = BUCKET) -> np.ndarray:
    """The length each row is padded to: its own length rounded up to the bucket, at most `limit`."""
    return np.minimum(-(-np.asarray(lens) // bucket) * bucket, limit).astype(np.int32)


def by_length(lens: np.ndarray, limit: int, bucket: int = BUCKET) -> np.ndarray:
    """Row order that puts equal padded lengths next to each other (stable: ties keep their order)."""
    return np.argsort(padded_lengths(lens, limit, bucket), kind="stable")


@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str, max_seq_length: int | None = None) -> tuple[object, int]:
    """(the model folder's tokenizer, the token limit) without loading the model's weights or torch: a
    tokenizing process stays small. The limit is the one SentenceTransformer applies: the given
    max_seq_length, else the folder's sentence_bert_config.json, else the tokenizer's own (at most 512).
    Cached per process, so a Ray task pays the load once per worker."""
    from transformers import AutoTokenizer

    from qrag_ray.models.registry import resolve_embedder

    folder = Path(resolve_embedder(model))
    tok = AutoTokenizer.from_pretrained(str(folder))
    limit = max_seq_length
    cfg = folder / "sentence_bert_config.json"
    if not limit and cfg.is_file():
        limit = json.loads(cfg.read_text()).get("max_seq_length")
    return tok, int(limit or min(int(tok.model_max_length), 512))


class Tokenize:
    """map_batches UDF for CPU workers: adds `input_ids` (int32 [n, limit]) and `n_tokens` from
    `embed_text` and sorts the batch's rows by padded length, so the forward step finds runs of equal
    shape. Every other column rides along in the new order (rows carry their own keys)."""

    def __init__(self, model: str, max_seq_length: int | None = None, column: str = "embed_text"):
        self.tok, self.limit = load_tokenizer(model, max_seq_length)
        self.column = column

    def __call__(self, batch: dict) -> dict:
        ids, lens = token_ids(self.tok, list(batch[self.column]), self.limit)
        order = by_length(lens, self.limit)
        out = {k: np.asarray(v)[order] for k, v in batch.items()}
        out["input_ids"] = ids[order]
        out["n_tokens"] = lens[order]
        return out
