"""The forward step: token arrays in (from `tokens.py`), unit-norm float32 vectors out, in input order.

It only groups rows, slices and stacks their ids, moves them to the model's device, runs the model
(transformer, the folder's own pooling) and normalises: no tokenizing, no per-row Python, so a GPU is
fed as fast as it computes. Two ways to group rows:

- by tokens (`tokens_per_batch`), the GPU way: rows in padded-length order fill a forward pass until
  rows x padded length would pass the budget, padded to the longest row's bucket in it. Big passes
  keep a GPU busy whatever the row lengths; a row's vector then depends (in the last bits, or about
  1e-3 in bfloat16) on which rows shared its pass.
- canonical (`canonical_rows`), what `encode_canonical` and every CPU build use: each pass holds rows
  of one padded length only and exactly `canonical_rows` rows (a short group is filled with copies of
  its first row), so a row's shapes, and with them its bits, never depend on the other rows.

What holds on a GPU: the canonical grouping gives the same bits run after run on the same GPU model,
driver and library versions (the kernels are chosen by shape and are deterministic for inference),
but not the bits of a CPU or of another GPU model; grouping by tokens gives the same bits only for the
same batches. So a GPU build resumed after a crash may differ from an uninterrupted one in the last
bits of the re-embedded rows (and so in checksums), not in rankings; build canonically where
byte-identical resumes matter more than speed.
"""

from __future__ import annotations

import numpy as np

from qrag_ray.embedding.load import embedding_dim, encode, precision
from qrag_ray.embedding.tokens import BUCKET, padded_lengths, token_ids


def plan(lens: np.ndarray, limit: int, tokens_per_batch: int | None = None, canonical_rows: int | None = None,
         bucket: int = BUCKET) -> list[tuple[np.ndarray, int, int]]:
    """The forward passes for rows of these lengths: (row indices, padded length, copies of the first
    row appended to fill the pass). Exactly one of tokens_per_batch / canonical_rows."""
    if (tokens_per_batch is None) == (canonical_rows is None):
        raise ValueError("give tokens_per_batch or canonical_rows")
    padded = padded_lengths(lens, limit, bucket)
    out: list[tuple[np.ndarray, int, int]] = []
    if canonical_rows is not None:
        for length in np.unique(padded):
            idx = np.flatnonzero(padded == length)
            for s in range(0, len(idx), canonical_rows):
                grp = idx[s:s + canonical_rows]
                out.append((grp, int(length), canonical_rows - len(grp)))
        return out
    order = np.argsort(padded, kind="stable")
    sorted_len = padded[order].astype(np.int64)
    s = 0
    while s < len(order):
        # sorted, so a pass's last row is its longest and rows x that length only grows with the rows
        cost = np.arange(1, len(order) - s + 1) * sorted_len[s:]
        e = s + max(1, int(np.searchsorted(cost, tokens_per_batch, side="right")))
        out.append((order[s:e], int(sorted_len[e - 1]), 0))
        s = e
    return out


class Forward:
    """The model's side of the embedding stage (the GPU actor's work): `forward(ids, lens)` ->
    float32 [n, dim] in input order. On CUDA the ids go through pinned memory with non-blocking copies
    and the vectors come back in one copy per call, so the host prepares the next pass while the GPU
    computes."""

    def __init__(self, st, tokens_per_batch: int | None = 65536, canonical_rows: int | None = None,
                 bucket: int = BUCKET):
        import torch

        self.st = st
        self.device = torch.device(st.device)
        self.tokens_per_batch = None if canonical_rows is not None else tokens_per_batch
        self.canonical_rows = canonical_rows
        self.bucket = bucket
        names = set(st.tokenizer.model_input_names)
        self.token_types = "token_type_ids" in names
        self.left = st.tokenizer.padding_side == "left"

    def to_device(self, a: np.ndarray):
        """A host array on the model's device as int64 (copied as int32: half the bytes to move)."""
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a))
        if self.device.type == "cuda":
            t = t.pin_memory().to(self.device, non_blocking=True)
        return t.long()

    def passes(self, ids: np.ndarray, lens: np.ndarray):
        """(row indices, ids [rows, L], lengths [rows]) per forward pass, on the host, fill included."""
        ids = np.stack(ids) if ids.dtype == object else ids
        width = ids.shape[1]
        for idx, length, fill in plan(lens, width, self.tokens_per_batch, self.canonical_rows, self.bucket):
            rows = np.concatenate([idx, np.repeat(idx[:1], fill)]) if fill else idx
            cols = slice(width - length, width) if self.left else slice(0, length)
            yield idx, ids[rows, cols], lens[rows]

    def embed(self, ids_t, lens_t):
        """Device ids [rows, L] and lengths -> unit-norm float32 vectors on the device."""
        import torch

        pos = torch.arange(ids_t.shape[1], device=ids_t.device)
        start = (ids_t.shape[1] - lens_t)[:, None] if self.left else None
        mask = (pos[None, :] >= start) if self.left else (pos[None, :] < lens_t[:, None])
        feats = {"input_ids": ids_t, "attention_mask": mask.long()}
        if self.token_types:
            feats["token_type_ids"] = torch.zeros_like(ids_t)
        with torch.inference_mode(), precision(self.st):
            e = self.st.forward(feats)["sentence_embedding"].float()
        return torch.nn.functional.normalize(e, p=2, dim=1)

    def __call__(self, ids: np.ndarray, lens: np.ndarray) -> np.ndarray:
        import torch

        lens = np.asarray(lens, np.int32)
        done, parts = [], []
        for idx, x, n in self.passes(ids, lens):
            e = self.embed(self.to_device(x), self.to_device(n))
            done.append(idx)
            parts.append(e[:len(idx)])
        dim = embedding_dim(self.st)
        out = np.zeros((len(lens), dim), np.float32)
        if parts:
            out[np.concatenate(done)] = torch.cat(parts).cpu().numpy()
        return out


def encode_canonical(st, texts: list[str], micro_batch: int = 32, bucket: int = BUCKET) -> np.ndarray:
    """Like `encode`, but each text's vector does not depend on which other texts share its batch.

    Why: a resumed build embeds a different mix of rows per batch than an uninterrupted one, and
    BLAS results move in the last bits with the padded length and the batch shape (measured: up to
    2.6e-7 on MiniLM), which changes the FAISS files' checksums. Here a text is padded to a length
    bucket decided by its own token count, and every forward pass has exactly `micro_batch` rows
    (short groups are filled with copies), so the shapes, and with them the numbers, are fixed per
    text. Costs a little padding; equal to `encode` within ~2e-7. On a GPU see this module's note."""
    texts = [str(t) for t in texts]
    tok = getattr(st, "tokenizer", None)
    if not texts or tok is None:
        return encode(st, texts, micro_batch)
    ids, lens = token_ids(tok, texts, int(st.max_seq_length or 512))
    return Forward(st, canonical_rows=micro_batch, bucket=bucket)(ids, lens)
