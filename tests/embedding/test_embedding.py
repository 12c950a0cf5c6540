"""The embedding stage's pieces: tokenization on its own (ids, lengths, length order), the forward
step's grouping (canonical or by tokens), precision choices, and that the canonical CPU vectors are
the same bits as the tokenize-and-pad encode every index so far was built with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qrag_ray.embedding.forward import canonical_pass_rows, plan
from qrag_ray.embedding.load import resolve_dtype
from qrag_ray.embedding.tokens import Tokenize, by_length, load_tokenizer, padded_lengths, token_ids

SHAPE = str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "minilm-shape")
TEXTS = ["What does the break statement do?", "", "x " * 400, "Ships sail on the sea.",
         "A loop's else clause runs when the loop ends without break, " * 3, "ünïcödé 東京 text"]


def test_padded_lengths_round_up_to_the_bucket_and_stop_at_the_limit():
    assert padded_lengths(np.array([1, 16, 17, 250, 256]), 256).tolist() == [16, 16, 32, 256, 256]
    assert padded_lengths(np.array([5, 20]), 24, bucket=8).tolist() == [8, 24]
    assert by_length(np.array([40, 3, 20, 5, 33]), 256).tolist() == [1, 3, 2, 0, 4]  # stable within a bucket


def test_canonical_plan_is_fixed_rows_per_length_filled_with_copies():
    lens = np.array([3, 40, 5, 3, 40, 17, 3])
    got = [(idx.tolist(), length, fill) for idx, length, fill in plan(lens, 256, 4096, canonical_rows=2)]
    assert got == [([0, 2], 16, 0), ([3, 6], 16, 0), ([5], 32, 1), ([1, 4], 48, 0)]
    # the token budget bounds a pass too: 64 tokens are 4 rows of 16, 2 of 32, 1 of 48 (never fewer than 1)
    got = [(idx.tolist(), length, fill) for idx, length, fill in plan(lens, 256, 64, canonical_rows=8)]
    assert got == [([0, 2, 3, 6], 16, 0), ([5], 32, 1), ([1], 48, 0), ([4], 48, 0)]
    assert [canonical_pass_rows(n, 512, 64) for n in (16, 128, 256, 512)] == [32, 4, 2, 1]


def test_token_plan_covers_every_row_once_within_the_budget():
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 300, 1000)
    passes = plan(lens, 256, tokens_per_batch=4096)
    seen = np.concatenate([idx for idx, _, _ in passes])
    assert sorted(seen.tolist()) == list(range(1000))
    padded = padded_lengths(lens, 256)
    for idx, length, fill in passes:
        assert fill == 0 and length == padded[idx].max() and len(idx) * length <= 4096
    # rows are many per pass, not one per bucket: the budget is what bounds a pass
    assert len(passes) <= int(np.ceil(padded.sum() / 4096)) + 16
    assert [(i.tolist(), n, f) for i, n, f in plan(np.array([300]), 256, tokens_per_batch=100)] == [([0], 256, 0)]


def test_token_ids_equal_the_tokenizer_call_padded_to_the_limit():
    tok, limit = load_tokenizer(SHAPE)
    assert limit == 256  # the folder's sentence_bert_config.json, as SentenceTransformer applies it
    ids, lens = token_ids(tok, TEXTS, limit)
    ref = tok(TEXTS, truncation=True, max_length=limit)["input_ids"]
    assert ids.dtype == np.int32 and ids.shape == (len(TEXTS), limit)
    assert lens.tolist() == [len(r) for r in ref] and lens[2] == limit
    for row, want in zip(ids, ref, strict=True):
        assert row[:len(want)].tolist() == want and not row[len(want):].any()


@pytest.mark.parametrize("limit", [8, 32, 256])
def test_texts_cut_before_encoding_give_the_ids_of_the_whole_text(limit):
    """A long text is cut at a space to CHARS_PER_TOKEN characters per token before it is encoded; the
    ids after truncation are the tokenizer's own on the whole text, for real prose (the Python
    reference), texts whose cut keeps fewer tokens than the limit (long words: encoded whole), and
    texts without a space."""
    from pydoc_data.topics import topics

    from qrag_ray.embedding.tokens import CHARS_PER_TOKEN, cut_text

    tok, _ = load_tokenizer(SHAPE)
    long_words = " ".join(["antidisestablishmentarianism" * 3] * 400)
    texts = [*TEXTS, *list(topics.values())[:40], long_words, "é" * 5000, " " * 3000 + "late words", "a\n" * 3000]
    assert sum(cut_text(t, limit) is not t for t in texts) >= 3
    assert all(len(cut_text(t, limit)) <= CHARS_PER_TOKEN * limit or cut_text(t, limit) is t for t in texts)
    ids, lens = token_ids(tok, texts, limit)
    ref = tok(texts, truncation=True, max_length=limit)["input_ids"]
    assert lens.tolist() == [len(r) for r in ref]
    for row, want in zip(ids, ref, strict=True):
        assert row[:len(want)].tolist() == want


def test_left_padding_tokenizers_keep_their_side():
    tok, limit = load_tokenizer(SHAPE)
    tok = type(tok).from_pretrained(SHAPE, padding_side="left")
    ids, lens = token_ids(tok, TEXTS[:2], 32)
    ref = tok(TEXTS[:2], truncation=True, max_length=32)["input_ids"]
    assert ids[0, 32 - lens[0]:].tolist() == ref[0] and not ids[0, :32 - lens[0]].any()


def test_tokenize_udf_sorts_rows_by_length_and_ships_them_unpadded():
    batch = {"embed_text": np.asarray(TEXTS, dtype=object), "row_key": np.arange(len(TEXTS)) * 10}
    out = Tokenize(SHAPE)(batch)
    assert out["input_ids"].dtype == object and len(out["input_ids"]) == len(TEXTS)
    assert np.all(np.diff(padded_lengths(out["n_tokens"], 256)) >= 0)
    tok, limit = load_tokenizer(SHAPE)
    for text, key, count, ids in zip(out["embed_text"], out["row_key"], out["n_tokens"], out["input_ids"], strict=True):
        ref = tok(text, truncation=True, max_length=limit)["input_ids"]
        assert TEXTS[key // 10] == text and len(ref) == count and ids.dtype == np.int32 and ids.tolist() == ref


@pytest.mark.parametrize("side", ["right", "left"])
def test_forward_passes_are_the_same_from_padded_ragged_or_equal_length_ids(side):
    """The forward step builds each pass from token_ids' padded rows, Tokenize's ragged rows, or a
    ragged column Ray Data handed over as one 2-d array (rows of one length): the same ids each time."""
    from qrag_ray.embedding.forward import pass_ids
    from qrag_ray.embedding.tokens import ragged

    tok, limit = load_tokenizer(SHAPE)
    tok = type(tok).from_pretrained(SHAPE, padding_side=side)
    texts = [*TEXTS, TEXTS[3], *(" ".join(["word"] * k) for k in range(1, 60, 3))]
    padded, lens = token_ids(tok, texts, limit)
    seqs = [(row[:n] if side == "right" else row[limit - n:]).tolist() for row, n in zip(padded, lens, strict=True)]
    left = side == "left"
    from_padded = pass_ids(padded, lens, left, 0)
    from_ragged = pass_ids(ragged(seqs), lens, left, 0)
    for rows, length in [(np.arange(len(texts)), 256), (np.flatnonzero(lens <= 16), 16), (np.array([3, 3, 0]), 64)]:
        assert np.array_equal(from_padded(rows, length), from_ragged(rows, length))
    same = np.flatnonzero(lens == lens[3])
    assert len(same) > 1
    two_d = np.stack([np.asarray(seqs[i], np.int32) for i in same])
    assert np.array_equal(pass_ids(two_d, lens[same], left, 0)(np.arange(len(same)), 32),
                          from_padded(same, 32))


def test_dtype_auto_is_float32_on_cpu_and_half_precision_on_cuda():
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("auto", "cuda") == "bfloat16" and resolve_dtype("tf32", "cuda:0") == "tf32"
    with pytest.raises(ValueError, match="tf32 needs a CUDA"):
        resolve_dtype("tf32", "cpu")
    with pytest.raises(ValueError, match="unknown embedder dtype"):
        resolve_dtype("int8", "cpu")


def test_embedder_config_names_the_precision_and_the_token_budget():
    from pydantic import ValidationError

    from qrag_ray.config.index import EmbedderConfig, EmbedderRunConfig

    assert EmbedderConfig().dtype == "auto" and EmbedderRunConfig().tokens_per_batch is None
    with pytest.raises(ValidationError):
        EmbedderConfig(dtype="fp8")


# ------------------------------------------------------------------ with the real MiniLM (integration)


def _pad_reference(model, texts: list[str], micro_batch: int, tokens: int = 512, bucket: int = 16) -> np.ndarray:
    """The canonical encode with the tokenizer's own `pad` per group: each padded length L in groups of
    max(1, min(micro_batch, tokens // L)) rows, the last filled with copies of its first row."""
    import torch

    tok = model.tokenizer
    limit = int(model.max_seq_length or 512)
    enc = tok(texts, truncation=True, max_length=limit)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
    padded = np.minimum(-(-np.asarray([len(x) for x in enc["input_ids"]]) // bucket) * bucket, limit)
    out = np.zeros((len(texts), 384), np.float32)
    for length in np.unique(padded):
        idx = np.flatnonzero(padded == length)
        rows = max(1, min(micro_batch, tokens // int(length)))
        for start in range(0, len(idx), rows):
            grp = idx[start:start + rows].tolist()
            count = len(grp)
            grp += [grp[0]] * (rows - count)
            feats = tok.pad({k: [enc[k][i] for i in grp] for k in keys}, padding="max_length",
                            max_length=int(length), return_tensors="pt")
            with torch.inference_mode():
                vectors = model.forward(dict(feats))["sentence_embedding"].float()
            out[idx[start:start + count]] = torch.nn.functional.normalize(vectors, p=2, dim=1).numpy()[:count]
    return out


def _texts() -> list[str]:
    rng = np.random.default_rng(3)
    words = ["the", "loop", "break", "value", "list", "index", "shard", "vector", "river", "music", "field", "python",
             "else", "clause"]
    return TEXTS + [" ".join(rng.choice(words, int(rng.integers(1, 90)))) for _ in range(60)]


@pytest.mark.integration
def test_canonical_vectors_are_the_bits_of_the_padded_encode(minilm):
    from qrag_ray.embedding import encode_canonical

    texts = _texts()
    assert np.array_equal(encode_canonical(minilm, texts, 16), _pad_reference(minilm, texts, 16))


@pytest.mark.integration
def test_forward_by_tokens_matches_canonical_in_input_order(minilm):
    from qrag_ray.embedding import Forward, encode_canonical
    from qrag_ray.embedding.tokens import token_ids

    texts = _texts()
    ids, lens = token_ids(minilm.tokenizer, texts, 256)
    got = Forward(minilm, tokens_per_batch=1024)(ids, lens)
    want = encode_canonical(minilm, texts, 16)
    assert got.dtype == np.float32 and np.abs(got - want).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)


@pytest.mark.integration
def test_bfloat16_keeps_vectors_close_and_tf32_is_refused_on_cpu():
    from qrag_ray.embedding import Forward, encode, encode_canonical, load_sentence_transformer
    from qrag_ray.embedding.tokens import token_ids

    texts = _texts()
    fp32 = load_sentence_transformer("all-MiniLM-L6-v2", device="cpu", backend="torch")
    bf16 = load_sentence_transformer("all-MiniLM-L6-v2", device="cpu", dtype="bfloat16")
    ids, lens = token_ids(bf16.tokenizer, texts, 256)
    got = Forward(bf16, tokens_per_batch=4096)(ids, lens)
    want = encode_canonical(fp32, texts, 16)
    assert got.dtype == np.float32 and 0 < np.abs(got - want).max() < 3e-2
    assert (got * want).sum(1).min() > 0.99
    query_vecs = encode(bf16, texts[:4])  # the query side's call on a half-precision model
    assert query_vecs.dtype == np.float32 and (query_vecs * want[:4]).sum(1).min() > 0.99
    with pytest.raises(ValueError, match="tf32"):
        load_sentence_transformer("all-MiniLM-L6-v2", device="cpu", dtype="tf32")
