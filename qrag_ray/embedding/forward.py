"""The forward step: token ids in (from `tokens.py`: padded or ragged), unit-norm float32 vectors out,
in input order; no tokenizing, no per-row Python, so a GPU is fed as fast as it computes; each pass is
padded to its own length only. Rows are grouped by tokens (`tokens_per_batch`, the GPU way: a row's
last bits then depend on its pass-mates) or canonically (`canonical_rows`, every CPU build: each padded
length in passes of one shape, so a row's bits never depend on the others; on a GPU only for the same
GPU model, driver and libraries)."""

from __future__ import annotations

import numpy as np

from qrag_ray.embedding.load import embedding_dim, encode, precision
from qrag_ray.embedding.tokens import padded_lengths, token_ids

# A forward pass's tokens (rows x padded length) when the config leaves it open. A GPU wants large passes;
# on CPU passes of about 512 tokens run fastest (2-3x the rows per second of 64 rows of any length, passages
# and questions alike: docs/BENCHMARKS.md), and a small build then pays for few filler rows.
GPU_TOKENS_PER_BATCH = 65536
CPU_TOKENS_PER_BATCH = 512


def default_tokens_per_batch(on_gpu: bool) -> int:
    return GPU_TOKENS_PER_BATCH if on_gpu else CPU_TOKENS_PER_BATCH


def canonical_pass_rows(length: int, tokens_per_batch: int, canonical_rows: int) -> int:
    """Rows in each canonical pass of this padded length: a function of the length alone (and the two
    settings), never of which rows the batch holds."""
    return max(1, min(canonical_rows, tokens_per_batch // int(length)))


def plan(lens: np.ndarray, limit: int, tokens_per_batch: int,
         canonical_rows: int | None = None) -> list[tuple[np.ndarray, int, int]]:
    """The forward passes for rows of these lengths: (row indices, padded length, copies of the first
    row appended to fill the pass). With `canonical_rows`, each padded length L in passes of exactly
    `canonical_pass_rows(L, ...)` rows (at most canonical_rows, at most tokens_per_batch tokens, one at
    least), the last filled with copies; without, rows sorted by length and packed up to tokens_per_batch."""
    padded = padded_lengths(lens, limit)
    out: list[tuple[np.ndarray, int, int]] = []
    if canonical_rows is not None:
        for length in np.unique(padded):
            idx = np.flatnonzero(padded == length)
            rows = canonical_pass_rows(length, tokens_per_batch, canonical_rows)
            for start in range(0, len(idx), rows):
                grp = idx[start:start + rows]
                out.append((grp, int(length), rows - len(grp)))
        return out
    order = np.argsort(padded, kind="stable")
    sorted_len = padded[order].astype(np.int64)
    start = 0
    while start < len(order):
        # sorted, so a pass's last row is its longest and rows x that length only grows with the rows
        cost = np.arange(1, len(order) - start + 1) * sorted_len[start:]
        end = start + max(1, int(np.searchsorted(cost, tokens_per_batch, side="right")))
        out.append((order[start:end], int(sorted_len[end - 1]), 0))
        start = end
    return out


class Forward:
    """`Forward(model, ...)(ids, lens)` -> float32 [n, dim] in input order. On CUDA ids are copied from
    pinned memory without blocking, so the host prepares the next pass while the GPU computes."""

    def __init__(self, model, tokens_per_batch: int = GPU_TOKENS_PER_BATCH, canonical_rows: int | None = None):
        import torch

        self.model = model
        self.device = torch.device(model.device)
        self.tokens_per_batch = tokens_per_batch
        self.canonical_rows = canonical_rows
        self.token_types = "token_type_ids" in model.tokenizer.model_input_names
        self.left = model.tokenizer.padding_side == "left"
        self.pad = model.tokenizer.pad_token_id or 0
        self.limit = int(model.max_seq_length or 512)  # the limit the canonical shapes are drawn from

    def to_device(self, array: np.ndarray):
        """A host array on the model's device as int64 (copied as int32: half the bytes to move)."""
        import torch

        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type == "cuda":
            tensor = tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.long()

    def passes(self, ids: np.ndarray, lens: np.ndarray):
        """(row indices, ids [rows, L], lengths [rows]) per forward pass, on the host, fill included; the
        passes' shapes come from the lengths alone, however `ids` arrived (see `pass_ids`)."""
        take = pass_ids(ids, lens, self.left, self.pad)
        for idx, length, fill in plan(lens, self.limit, self.tokens_per_batch, self.canonical_rows):
            rows = np.concatenate([idx, np.repeat(idx[:1], fill)]) if fill else idx
            yield idx, take(rows, length), lens[rows]

    def embed(self, ids_t, lens_t):
        """Device ids [rows, L] and lengths -> unit-norm float32 vectors on the device."""
        import torch

        pos = torch.arange(ids_t.shape[1], device=ids_t.device)[None, :]
        mask = pos >= (ids_t.shape[1] - lens_t)[:, None] if self.left else pos < lens_t[:, None]
        feats = {"input_ids": ids_t, "attention_mask": mask.long()}
        if self.token_types:
            feats["token_type_ids"] = torch.zeros_like(ids_t)
        with torch.inference_mode(), precision(self.model):
            vectors = self.model.forward(feats)["sentence_embedding"].float()
        return torch.nn.functional.normalize(vectors, p=2, dim=1)

    def __call__(self, ids: np.ndarray, lens: np.ndarray, on_pass=None) -> np.ndarray:
        import torch

        lens = np.asarray(lens, np.int32)
        done = []
        parts = []
        for rows, pass_tokens, pass_lens in self.passes(ids, lens):
            done.append(rows)
            parts.append(self.embed(self.to_device(pass_tokens), self.to_device(pass_lens))[:len(rows)])
            on_pass and on_pass(len(rows))  # rows done, for the progress display
        out = np.zeros((len(lens), embedding_dim(self.model)), np.float32)
        if parts:
            out[np.concatenate(done)] = torch.cat(parts).cpu().numpy()
        return out


def pass_ids(ids: np.ndarray, lens: np.ndarray, left: bool, pad: int):
    """`take(rows, length)` -> those rows' ids [len(rows), length], padded on the tokenizer's side with
    `pad`. `ids`: an int array [n, width] padded on that side (`token_ids`), or ragged rows, one array
    each, at least its row's length (`Tokenize`; Ray Data may also hand a ragged column over as a 2-d
    array when its rows happen to be equally long)."""
    lens = np.asarray(lens, np.int64)
    if ids.dtype != object:
        width = ids.shape[1]

        def take_padded(rows: np.ndarray, length: int) -> np.ndarray:
            if length <= width:
                return ids[rows, width - length:] if left else ids[rows, :length]
            out = np.full((len(rows), length), pad, ids.dtype)
            out[:, slice(length - width, length) if left else slice(0, width)] = ids[rows]
            return out

        return take_padded
    widths = np.fromiter((len(r) for r in ids), np.int64, len(ids))
    flat = np.concatenate(list(ids)) if len(ids) else np.zeros(0, np.int32)
    first = np.cumsum(widths) - widths + (widths - lens if left else 0)  # each row's first token in `flat`

    def take_ragged(rows: np.ndarray, length: int) -> np.ndarray:
        row_lens = lens[rows][:, None]
        pos = np.arange(length)[None, :] - (length - row_lens if left else 0)  # the token's place in its row
        real = (pos >= 0) & (pos < row_lens)
        out = np.full((len(rows), length), pad, flat.dtype)
        out[real] = flat[(first[rows][:, None] + pos)[real]]
        return out

    return take_ragged


def encode_canonical(model, texts: list[str], micro_batch: int = 32,
                     tokens_per_batch: int = CPU_TOKENS_PER_BATCH) -> np.ndarray:
    """Like `encode`, but a text's vector does not depend on its batch-mates (a resumed build batches
    differently, and BLAS results move in the last bits with the batch's shape): a CPU build's vectors."""
    texts = [str(t) for t in texts]
    tok = getattr(model, "tokenizer", None)
    if not texts or tok is None:
        return encode(model, texts, micro_batch)
    ids, lens = token_ids(tok, texts, int(model.max_seq_length or 512))
    return Forward(model, tokens_per_batch, canonical_rows=micro_batch)(ids, lens)
