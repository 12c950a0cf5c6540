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
    words = ["the", "loop", "break", "value", "list", "index", "shard", "vector", "river", "music", "field", "python",
             "else", "clause"]
    texts = [" ".join(rng.choice(words, int(rng.integers(1, 40)))) for _ in range(40)]
    whole = encode_canonical(minilm, texts, 16)
    shifted = encode_canonical(minilm, texts[7:] + texts[:7], 16)
    alone = np.stack([encode_canonical(minilm, [t], 16)[0] for t in texts[:5]])
    assert np.array_equal(whole[7:], shifted[:33]) and np.array_equal(whole[:5], alone)
    # the plain encode moves with its batch: the reason encode_canonical exists
    assert np.abs(encode(minilm, texts) - whole).max() < 1e-5


def test_row_keys_name_content_not_position():
    first = workdir.row_keys([1, 1, 2], ["chunk", "question", "chunk"], [0, 1, 0], ["x", "q?", "y"], ["x", "q?", "y"])
    second = workdir.row_keys([2, 1], ["chunk", "chunk"], [0, 0], ["y", "x"], ["y", "x"])
    assert first[2] == second[0] and first[0] == second[1] and len(set(first.tolist())) == 3 and (first >= 0).all()
    assert workdir.part_name(first) == workdir.part_name(first[::-1])
    done = np.sort(second)
    assert workdir.isin_sorted(first, done).tolist() == [True, False, True]
    assert workdir.isin_sorted(first, np.zeros(0, np.int64)).tolist() == [False] * 3


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
            table = pa.table({"row_key": keys[idx], "store": np.ones(len(idx), bool),
                              "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs[idx].ravel()), 8)})
            atomic_write_parquet(table, root / "vectors" / f"{i:03d}.parquet")

    write(tmp_path / "a", [100, 300])
    write(tmp_path / "b", [50, 120, 400, 450])
    sample = sample_vectors(tmp_path / "a", 500, 60)
    assert sample.shape == (60, 8) and np.array_equal(sample, sample_vectors(tmp_path / "b", 500, 60))
    keep = np.sort(keys[:250])  # a run that holds only half the rows samples only from them
    kept_sample = sample_vectors(tmp_path / "a", 250, 60, keep)
    assert {v.tobytes() for v in kept_sample} <= {v.tobytes() for v in vecs[:250]}


def test_content_hash_ignores_timings_and_paths():
    files = {"shards/00000.faiss": "ab", "chunks.parquet": "cd"}
    first = index_identity({"representation": "chunk", "build": {"output": "/a", "keep_work": True}})
    second = index_identity({"representation": "chunk", "build": {"output": "/b", "keep_work": False}})
    assert manifest_content_hash(files, first) == manifest_content_hash(dict(reversed(files.items())), second)
    assert manifest_content_hash({**files, "chunks.parquet": "ce"}, first) != manifest_content_hash(files, first)


def test_a_part_holds_every_shard_of_its_batch_in_row_groups_read_by_shard(tmp_path):
    """One file per batch whatever the shard count; a shard's reader finds its own row groups from the
    footers and reads exactly its rows, in the batch's order."""
    rng = np.random.default_rng(2)
    shard = rng.integers(0, 32, 500).astype(np.int32)
    shard[shard == 7] = 8  # a shard the batch does not touch
    table = pa.table({"row_key": np.arange(500, dtype=np.int64), "shard": shard})
    workdir.write_part(table, tmp_path / "p" / "a.parquet")
    workdir.write_part(table.slice(0, 10), tmp_path / "p" / "b.parquet")
    files = workdir.parquet_files(tmp_path / "p")
    assert [f.name for f in files] == ["a.parquet", "b.parquet"]
    import pyarrow.parquet as pq

    assert pq.ParquetFile(files[0]).num_row_groups == len(np.unique(shard))
    for shard_no in (0, 7, 8, 31):
        groups = workdir.shard_row_groups(files, shard_no)
        got = [t.column("row_key").to_pylist() for t in workdir.read_row_groups(groups, ["row_key"], shard_no)]
        want = [w.tolist() for w in (np.flatnonzero(shard == shard_no), np.flatnonzero(shard[:10] == shard_no))
                if len(w)]
        assert got == want, shard_no  # a file without the shard's rows gives no row group to read


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.soak  # 32 shards: the soak tier's (as test_resume.py's 32-shard build)
def test_an_embedding_batch_writes_the_same_few_files_at_1_and_32_shards(tmp_path):
    """A 4,096-row batch through the real EmbedSink, and its chunks through the chunker's part writer:
    the same files whatever the shard count (row keys, vectors, sample stripe; chunk part, registry),
    and each shard's build reads back exactly its rows."""
    from qrag_ray.index.rows import chunk_columns
    from qrag_ray.index.udfs import EmbedSink, write_chunk_part

    rows = 4096
    written = {}
    for shards in (1, 32):
        work = tmp_path / f"shards{shards}"
        idx = np.arange(rows, dtype=np.int64) * 7919
        chunks = [{"chunk_id": f"d{i}#0", "doc_id": f"d{i}", "title": "", "text": f"row {i}", "chunk_idx": int(c),
                   "shard": int(c % shards), "url": "", "metadata": ""} for i, c in enumerate(idx)]
        write_chunk_part(chunk_columns(chunks, False), rows, work, "run")
        batch = {"chunk_idx": idx, "kind": np.full(rows, "chunk", object), "ord": np.zeros(rows, np.int32),
                 "text": np.asarray([c["text"] for c in chunks], object), "qn": np.full(rows, -1, np.int32),
                 "shard": (idx % shards).astype(np.int32), "store": np.ones(rows, bool)}
        batch["embed_text"] = batch["text"]
        sink = EmbedSink("all-MiniLM-L6-v2", 64, None, 1, str(work), None, "run")
        out = sink(batch)
        assert out["embedded"].all()
        written[shards] = sorted(str(p.relative_to(work).parent) for p in work.rglob("*.parquet"))
        written[shards] += sorted(str(p.relative_to(work).parent) for p in work.glob("chunks/runs/*/*.json"))
        for shard in (0, shards - 1):
            groups = workdir.shard_row_groups(workdir.parquet_files(work / "vectors"), shard)
            got = np.concatenate([t.column("chunk_idx").to_numpy()
                                  for t in workdir.read_row_groups(groups, ["chunk_idx"], shard)])
            assert sorted(got.tolist()) == idx[idx % shards == shard].tolist()
            assert len(workdir.run_row_keys(work, "run", shard)) == int(np.sum(idx % shards == shard))
    assert written[1] == written[32] == ["chunks", "runs/run/keys", "sample", "vectors", "chunks/runs/run"], written
