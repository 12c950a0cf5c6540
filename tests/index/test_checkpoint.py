"""The pieces that make a resumed build publish the same bytes: batch-invariant embedding, content
row keys, the key-chosen training sample and a content hash without timestamps (fast, no Ray)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from qrag_ray.config.index import index_identity
from qrag_ray.index import workdir
from qrag_ray.index.format import atomic_write_parquet, chunk_key, manifest_content_hash


@pytest.mark.integration
def test_canonical_encoding_does_not_depend_on_the_batch(minilm):
    from qrag_ray.embedding import encode, encode_canonical

    rng = np.random.default_rng(0)
    words = "the loop break value list index shard vector river music field python else clause".split()
    texts = [" ".join(rng.choice(words, int(rng.integers(1, 40)))) for _ in range(40)]
    whole = encode_canonical(minilm, texts, 16)
    shifted = encode_canonical(minilm, texts[7:] + texts[:7], 16)
    alone = np.stack([encode_canonical(minilm, [t], 16)[0] for t in texts[:5]])
    assert np.array_equal(whole[7:], shifted[:33]) and np.array_equal(whole[:5], alone)
    # the plain encode moves with its batch: the reason encode_canonical exists
    assert np.abs(encode(minilm, texts) - whole).max() < 1e-5


def test_row_keys_name_content_not_position():
    a = workdir.row_keys([1, 1, 2], ["chunk", "question", "chunk"], [0, 1, 0], ["x", "q?", "y"], ["x", "q?", "y"])
    b = workdir.row_keys([2, 1], ["chunk", "chunk"], [0, 0], ["y", "x"], ["y", "x"])
    assert a[2] == b[0] and a[0] == b[1] and len(set(a.tolist())) == 3 and (a >= 0).all()
    assert workdir.part_name(a) == workdir.part_name(a[::-1])
    done = np.sort(b)
    assert workdir.isin_sorted(a, done).tolist() == [True, False, True]
    assert workdir.isin_sorted(a, np.zeros(0, np.int64)).tolist() == [False] * 3


def test_keys_and_content_hash_are_pinned():
    """Chunk keys, row keys and the content hash name what earlier builds wrote: a changed hash would
    make every index and work dir on disk look foreign."""
    assert chunk_key("doc#0") == 6624106053859343019
    assert workdir.row_keys([chunk_key("doc#0")], ["chunk"], [0], ["x"], ["x"]).tolist() == [2688597523227159469]
    assert manifest_content_hash({"chunks.parquet": "cd"}, {"representation": "chunk"}) == (
        "04547a3b8a7ec4dbadf5b114b0d6e4492d6ff9b1d9c4397ba5db1d1f0c7530d5")


def test_sample_is_chosen_by_key_whatever_the_parts(tmp_path):
    from qrag_ray.index.tasks import sample_vectors

    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**62, 500, dtype=np.int64)
    vecs = rng.standard_normal((500, 8)).astype(np.float32)

    def write(root, splits):
        for i, idx in enumerate(np.split(np.arange(500), splits)):
            t = pa.table({"row_key": keys[idx], "store": np.ones(len(idx), bool),
                          "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs[idx].ravel()), 8)})
            atomic_write_parquet(t, root / "vectors" / "s=00000" / f"{i:03d}.parquet")

    write(tmp_path / "a", [100, 300])
    write(tmp_path / "b", [50, 120, 400, 450])
    sa = sample_vectors(tmp_path / "a", 500, 60)
    assert sa.shape == (60, 8) and np.array_equal(sa, sample_vectors(tmp_path / "b", 500, 60))
    keep = np.sort(keys[:250])  # a run that holds only half the rows samples only from them
    sk = sample_vectors(tmp_path / "a", 250, 60, keep)
    assert {v.tobytes() for v in sk} <= {v.tobytes() for v in vecs[:250]}


def test_content_hash_ignores_timings_and_paths():
    files = {"shards/00000.faiss": "ab", "chunks.parquet": "cd"}
    c1 = index_identity({"representation": "chunk", "build": {"output": "/a", "keep_work": True}})
    c2 = index_identity({"representation": "chunk", "build": {"output": "/b", "keep_work": False}})
    assert manifest_content_hash(files, c1) == manifest_content_hash(dict(reversed(files.items())), c2)
    assert manifest_content_hash({**files, "chunks.parquet": "ce"}, c1) != manifest_content_hash(files, c1)
