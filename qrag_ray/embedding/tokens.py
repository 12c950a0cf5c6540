"""Tokenization as its own CPU step (a GPU encodes faster than one host thread tokenizes): texts ->
token ids and lengths, equal to the tokenizer's own `tok(texts, truncation=True, max_length=limit)`;
in one process padded to the limit (`token_ids`), between processes ragged (`Tokenize`: each row its
own tokens, nothing padded in transit; the forward step pads each pass to its own length)."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import numpy as np

from qrag_ray.models.bundled import resolve_embedder

BUCKET = 16  # rows are padded to a multiple of this many tokens (the canonical encode's buckets)
# a text longer than this many characters per token of the limit is cut at a space before it is encoded
CHARS_PER_TOKEN = 8


def token_ids(tok, texts: list[str], limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [n, limit], lengths int32 [n]): truncated to `limit`, padded on the tokenizer's side."""
    seqs = encode_ids(tok, texts, limit)
    lens = np.fromiter((len(s) for s in seqs), np.int32, len(seqs))
    ids = np.full((len(seqs), limit), tok.pad_token_id or 0, np.int32)
    cols = np.arange(limit)
    mask = cols < lens[:, None] if tok.padding_side == "right" else cols >= limit - lens[:, None]
    ids[mask] = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(lens.sum()))
    return ids, lens


def encode_ids(tok, texts: list[str], limit: int) -> list[list[int]]:
    """Each text's token ids, truncated to `limit`."""
    texts = [str(t) for t in texts]
    if getattr(tok, "is_fast", False):
        # the Rust tokenizer straight: the Python wrapper's bookkeeping costs more than short texts
        rust = tok.backend_tokenizer
        rust.no_padding()
        rust.enable_truncation(limit, direction=tok.truncation_side)
        encode = getattr(rust, "encode_batch_fast", rust.encode_batch)  # the same ids, no offsets
        cut = [cut_text(t, limit) for t in texts] if tok.truncation_side == "right" else texts
        seqs = [e.ids for e in encode(cut)] if texts else []
        # words before a space encode alike whatever follows: a cut text that fills the limit has the
        # whole text's ids, one that does not is encoded whole
        for i in [i for i, c in enumerate(cut) if c is not texts[i] and len(seqs[i]) < limit]:
            seqs[i] = encode([texts[i]])[0].ids
    else:
        seqs = tok(texts, truncation=True, max_length=limit)["input_ids"] if texts else []
    return seqs


def cut_text(text: str, limit: int) -> str:
    """`text` up to its last space within CHARS_PER_TOKEN * limit characters (else itself): encoding costs
    as much as the text is long, and truncation keeps `limit` tokens anyway."""
    head = text[:CHARS_PER_TOKEN * limit].rsplit(None, 1)
    return head[0] if len(text) > CHARS_PER_TOKEN * limit and len(head) == 2 and head[0] else text


def padded_lengths(lens: np.ndarray, limit: int, bucket: int = BUCKET) -> np.ndarray:
    """The length each row is padded to: its own length rounded up to the bucket, at most `limit`."""
    return np.minimum(-(-np.asarray(lens) // bucket) * bucket, limit).astype(np.int32)


def by_length(lens: np.ndarray, limit: int) -> np.ndarray:
    """Row order that puts equal padded lengths next to each other (stable: ties keep their order)."""
    return np.argsort(padded_lengths(lens, limit), kind="stable")


@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str, max_seq_length: int | None = None) -> tuple[object, int]:
    """(the model folder's tokenizer, the token limit SentenceTransformer applies: max_seq_length, else
    sentence_bert_config.json's, else the tokenizer's own up to 512), without the weights or torch."""
    from transformers import AutoTokenizer

    folder = Path(resolve_embedder(model))
    tok = AutoTokenizer.from_pretrained(str(folder))
    cfg = folder / "sentence_bert_config.json"
    if not max_seq_length and cfg.is_file():
        max_seq_length = json.loads(cfg.read_text()).get("max_seq_length")
    return tok, int(max_seq_length or min(int(tok.model_max_length), 512))


def ragged(seqs: list[list[int]]) -> np.ndarray:
    """One int32 array per row, each as long as its row (an object column: Ray Data carries it as a
    variable-shaped tensor, so rows travel without padding)."""
    lens = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(lens.sum()))
    out = np.empty(len(seqs), dtype=object)
    for i, row in enumerate(np.split(flat, np.cumsum(lens)[:-1]) if len(seqs) else []):
        out[i] = row  # views of one buffer
    return out


class Tokenize:
    """map_batches UDF: adds `input_ids` (ragged, see `ragged`) and `n_tokens` from `embed_text` and
    sorts the batch's rows (every column) by padded length, so the forward step finds runs of equal
    shape."""

    def __init__(self, model: str, max_seq_length: int | None = None):
        self.tok, self.limit = load_tokenizer(model, max_seq_length)

    def __call__(self, batch: dict) -> dict:
        seqs = encode_ids(self.tok, list(batch["embed_text"]), self.limit)
        lens = np.fromiter((len(s) for s in seqs), np.int32, len(seqs))
        order = by_length(lens, self.limit)
        return {**{k: np.asarray(v)[order] for k, v in batch.items()}, "input_ids": ragged([seqs[i] for i in order]),
                "n_tokens": lens[order]}
