"""The on-disk index: manifest fields and checksums, FAISS factories through the shard writer, and the
atomic publish that never lets a reader see a half index."""

from __future__ import annotations

import json
import re
import shutil

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qrag_ray.config.index import FaissConfig, FilterConfig
from qrag_ray.errors import IndexFormatError
from qrag_ray.index.format import (
    FORMAT_VERSION,
    IndexDescription,
    load_manifest,
    publish,
    read_table_file,
    sha256_file,
    shard_chunks,
    shard_faiss,
    shard_meta,
    verify_files,
    write_manifest,
)
from qrag_ray.index.writer import write_shard
from qrag_ray.search.shard import Shard
from qrag_ray.text.sentences import split_sentences

# ---------------------------------------------------------------- manifest of a built index


@pytest.mark.integration
def test_manifest_fields_and_checksums(kinds_index):
    out, report = kinds_index
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("format_version", "index_version", "created_at", "representation", "kinds", "embedder", "faiss",
                "num_shards", "counts", "files", "shards", "config", "stage_seconds"):
        assert key in manifest, key
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["embedder"] == {"model": "all-MiniLM-L6-v2", "dim": 384, "normalize": True}
    assert manifest["faiss"]["factory"] == "Flat"
    assert manifest["representation"] == "chunk+sentence+question+quote+onedoc"
    assert set(manifest["counts"]) >= {"documents", "chunks", "questions", "vectors", "vectors_before_filters"}
    assert manifest["counts"]["documents"] == report.documents == 14
    expected_files = ({"chunks.parquet"} | {shard_faiss(i) for i in range(3)} | {shard_meta(i) for i in range(3)}
                      | {shard_chunks(i) for i in range(3)})
    assert set(manifest["files"]) == expected_files
    for rel, digest in manifest["files"].items():
        assert sha256_file(out / rel) == digest
    assert [s["id"] for s in manifest["shards"]] == [0, 1, 2]
    assert sum(s["vectors"] for s in manifest["shards"]) == manifest["counts"]["vectors"]
    assert sum(s["chunks"] for s in manifest["shards"]) == manifest["counts"]["chunks"]
    assert manifest["config"]["generator"]["backend"] == "precomputed"
    assert load_manifest(out, verify=True).index_version == manifest["index_version"]


@pytest.mark.integration
def test_load_manifest_rejects_bad_indexes(kinds_index, tmp_path):
    src, _ = kinds_index
    with pytest.raises(IndexFormatError, match="index not found"):
        load_manifest(tmp_path / "nope")
    with pytest.raises(IndexFormatError, match="not a qrag index"):
        load_manifest(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="corrupt manifest"):
        load_manifest(bad)
    shutil.rmtree(bad)
    shutil.copytree(src, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps(manifest | {"format_version": 99}))
    with pytest.raises(IndexFormatError, match="unsupported format_version 99"):
        load_manifest(bad)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    (bad / shard_meta(1)).unlink()
    with pytest.raises(IndexFormatError, match="incomplete"):
        load_manifest(bad)


@pytest.mark.integration
def test_flipped_byte_fails_checksum(kinds_index, tmp_path):
    src, _ = kinds_index
    bad = tmp_path / "flip"
    shutil.copytree(src, bad)
    path = bad / shard_faiss(2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    manifest = load_manifest(bad)  # cheap load checks presence only
    with pytest.raises(IndexFormatError, match="checksum mismatch"):
        verify_files(manifest)
    with pytest.raises(IndexFormatError, match="checksum mismatch"):
        Shard.open(bad, 2)
    Shard.open(bad, 0)  # the other shards are fine


@pytest.mark.integration
def test_a_loaded_shard_keeps_its_row_metadata_columnar_and_counts_its_bytes(kinds_index):
    """Every row's kind and text come back as the shard's metadata file holds them, each hit carries
    its row's kind, and the bytes an opened shard reports are its FAISS file, its row arrays and its chunk
    table."""
    import numpy as np

    out, _ = kinds_index
    manifest = load_manifest(out)
    for number in range(manifest.num_shards):
        shard = Shard.open(out, number)
        meta = read_table_file(out / manifest.shard(number).meta)
        rows = list(zip(meta.column("kind").to_pylist(), meta.column("text").to_pylist(), strict=True))
        got = shard.fetch_rows(range(shard.ntotal))  # read with one take
        assert len(rows) > 3 and [got[row] for row in range(shard.ntotal)] == rows
        few = list(range(shard.ntotal))[-3:]  # read one by one
        assert shard.fetch_rows(few) == {row: rows[row] for row in few} and shard.fetch_rows([]) == {}
        kinds = meta.column("kind").to_pylist()
        (hits,) = shard.nearest(np.ones((1, manifest.dim), np.float32), shard.ntotal + 5)
        assert hits.rows.shape == (shard.ntotal,) and sorted(hits.rows) == list(range(shard.ntotal))
        assert list(hits.kinds) == [kinds[row] for row in hits.rows]
        texts = sum(len(text.encode()) for text in meta.column("text").to_pylist())
        faiss_bytes = (out / manifest.shard(number).faiss).stat().st_size
        table_bytes = read_table_file(out / manifest.shard(number).chunk_table).nbytes
        assert faiss_bytes + texts + table_bytes < shard.nbytes
        assert shard.nbytes < faiss_bytes + texts + table_bytes + 24 * shard.ntotal + 64


@pytest.mark.integration
def test_an_index_written_before_the_arrow_shard_files_loads_and_ranks_the_same(kinds_index, tmp_path):
    """Earlier indexes hold a shard's row metadata as Parquet and its chunks only in chunks.parquet."""
    from qrag_ray.search.engine import SearchEngine

    out, _ = kinds_index
    old = tmp_path / "old"
    shutil.copytree(out, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for shard in manifest["shards"]:
        meta = read_table_file(old / shard["meta"])
        meta = meta.set_column(1, "kind", meta.column("kind").cast(pa.string()))
        (old / shard["meta"]).unlink()
        (old / shard.pop("chunk_table")).unlink()
        shard["meta"] = shard["meta"].replace(".arrow", ".parquet")
        pq.write_table(meta, old / shard["meta"])
    manifest["files"] = {str(f.relative_to(old)): sha256_file(f) for f in old.rglob("*")
                         if f.is_file() and f.name != "manifest.json"}
    (old / "manifest.json").write_text(json.dumps(manifest))
    query_vecs = np.random.default_rng(0).standard_normal((3, manifest["embedder"]["dim"])).astype(np.float32)

    def pages(engine: SearchEngine) -> list[list[dict]]:
        """The engine's top 5 for each query vector, as JSON."""
        return [[r.to_json() for r in page] for page in engine.search_vectors(query_vecs, 5)]

    old_pages = pages(SearchEngine(old))
    assert [len(page) for page in old_pages] == [5, 5, 5]  # results to compare, not two empty lists
    assert old_pages == pages(SearchEngine(out))


# ---------------------------------------------------------------- the typed manifest (no build)

SHARD = {"id": 0, "faiss": "shards/00000.faiss", "meta": "shards/00000.parquet", "vectors": 2,
         "vectors_before_filters": 3, "chunks": 1, "kinds": {"chunk": 2}, "seconds": 0.5}
# as an early build wrote it: no kinds, content, content_hash or built_on; a later qrag's field too
OLD = {"format_version": 1, "index_version": "0123abcd", "created_at": "2026-11-23T00:00:00Z", "num_shards": 1,
       "representation": "chunk", "embedder": {"model": "all-MiniLM-L6-v2", "dim": 384, "normalize": True},
       "faiss": {"factory": "Flat", "metric": "inner_product"}, "shards": [SHARD],
       "counts": {"documents": 1, "chunks": 1, "questions": 0, "vectors": 2, "vectors_before_filters": 3},
       "files": {}, "config": {"shards": 1}, "stage_seconds": {"total": 1.0}, "from_the_future": [1, 2]}


def _index_with(tmp_path, manifest: dict):
    folder = tmp_path / "idx"
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_an_older_manifest_reads_back_as_written(tmp_path):
    manifest = load_manifest(_index_with(tmp_path, OLD))
    assert manifest.data == OLD  # no key added, none lost
    assert (manifest.num_shards, manifest.dim, manifest.embedder_model, manifest.index_version,
            manifest.representation) == (
        1, 384, "all-MiniLM-L6-v2", "0123abcd", "chunk")
    assert manifest.shard(0).model_dump(exclude_unset=True) == SHARD and not manifest.has_bm25
    assert manifest.kinds is None and manifest.content_hash is None
    assert manifest.file("shards/00000.faiss") == tmp_path / "idx" / "shards" / "00000.faiss"


@pytest.mark.parametrize("change,needle", [
    ({"shards": [SHARD | {"vectors": "many"}]}, "shards.0.vectors: Input should be a valid integer"),
    ({"num_shards": 2}, "1 shards listed, num_shards=2"),
    ({"embedder": {"model": "m"}}, "embedder.dim: Field required"),
])
def test_a_mistyped_manifest_is_a_corrupt_index(tmp_path, change, needle):
    with pytest.raises(IndexFormatError, match="corrupt manifest .*" + re.escape(needle)):
        load_manifest(_index_with(tmp_path, OLD | change))


def test_write_manifest_adds_files_and_versions_to_the_description(tmp_path):
    staging = tmp_path / "staging"
    (staging / "shards").mkdir(parents=True)
    (staging / "shards" / "00000.faiss").write_bytes(b"faiss")
    (staging / "shards" / "00000.parquet").write_bytes(b"meta")
    desc = {k: v for k, v in OLD.items() if k not in ("format_version", "index_version", "files", "created_at")}
    plain = write_manifest(staging, IndexDescription.model_validate(desc))
    assert plain.files == {"shards/00000.faiss": sha256_file(staging / "shards" / "00000.faiss"),
                           "shards/00000.parquet": sha256_file(staging / "shards" / "00000.parquet")}
    assert plain.content_hash is None and "content_hash" not in plain.data  # only with a content config
    assert json.loads((staging / "manifest.json").read_text()) == plain.data == load_manifest(staging).data
    with_content = write_manifest(staging, IndexDescription.model_validate(desc | {"content": {"shards": 1}}))
    assert with_content.index_version == plain.index_version and len(with_content.content_hash) == 64


# ---------------------------------------------------------------- FAISS factories via the shard writer


@pytest.fixture(scope="module")
def sentence_table(embed):
    """~800 real sentence vectors from the Python reference, as the writer receives them (one chunk
    per topic)."""
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    rows = []
    for number, name in enumerate(sorted(topics)[:30]):
        for sentence in split_sentences(unwrap(topics[name])):
            rows.append((number, sentence))
    vecs = embed([s for _, s in rows])
    table = pa.table({
        "chunk_idx": pa.array([c for c, _ in rows], pa.int64()), "kind": pa.array(["sentence"] * len(rows)),
        "text": pa.array([s for _, s in rows]), "qn": pa.array([-1] * len(rows), pa.int32()),
        "store": pa.array([True] * len(rows)),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), pa.float32()), vecs.shape[1]),
    })
    return table, vecs


@pytest.mark.integration
# IVF-PQ with 4-bit fast-scan codes, the shipped factory's kind (8-bit PQ16 takes ~50 s to train here)
@pytest.mark.parametrize("factory,cls", [("Flat", faiss.IndexFlat), ("HNSW32", faiss.IndexHNSWFlat),
                                         ("IVF8,PQ16x4fs", faiss.IndexIVFPQFastScan)])
def test_factories(sentence_table, tmp_path, factory, cls):
    table, vecs = sentence_table
    assert len(vecs) > 600
    faiss.omp_set_num_threads(1)  # k-means under OpenMP crawls on a shared, oversubscribed 2-core box
    stats = write_shard(0, table, tmp_path, FilterConfig(), FaissConfig(factory=factory, nprobe=8), 384)
    assert stats["vectors"] == stats["vectors_before_filters"] == len(vecs)
    idx = faiss.read_index(str(tmp_path / shard_faiss(0)))
    assert isinstance(faiss.downcast_index(idx), cls) and idx.ntotal == len(vecs)
    assert idx.metric_type == faiss.METRIC_INNER_PRODUCT
    meta = read_table_file(tmp_path / shard_meta(0))
    assert meta.num_rows == len(vecs)
    # ids are grouped by chunk, and metadata row i describes FAISS id i
    assert np.all(np.diff(meta.column("chunk_idx").to_numpy()) >= 0)
    if isinstance(faiss.downcast_index(idx), faiss.IndexIVF):
        faiss.extract_index_ivf(idx).nprobe = 8
    sample = np.arange(0, len(vecs), 17)
    texts = meta.column("text").to_pylist()
    _, ids = idx.search(vecs[sample], 1)
    hit = np.mean([texts[i] == table.column("text")[int(s)].as_py() for s, i in zip(sample, ids[:, 0], strict=True)])
    assert hit >= (0.99 if "PQ" not in factory else 0.7), hit


@pytest.mark.integration
def test_max_atoms_writes_at_most_m_pooled_vectors_per_chunk(sentence_table, tmp_path):
    """The writer stores what the per-chunk filters return: with max_atoms each chunk keeps at most m of
    its sentence vectors, their clusters' unit centroids, and metadata row i still describes FAISS id i."""
    table, vecs = sentence_table
    stats = write_shard(0, table, tmp_path, FilterConfig(max_atoms=2), FaissConfig(factory="Flat"), 384)
    meta = read_table_file(tmp_path / shard_meta(0))
    per_chunk = np.unique(meta.column("chunk_idx").to_numpy(), return_counts=True)[1]
    assert stats["vectors"] == meta.num_rows < len(vecs) and per_chunk.max() == 2
    stored = faiss.read_index(str(tmp_path / shard_faiss(0))).reconstruct_n(0, meta.num_rows)
    assert np.allclose(np.linalg.norm(stored, axis=1), 1, atol=1e-5)
    originals = {t: v for t, v in zip(table.column("text").to_pylist(), vecs, strict=True)}
    pooled = [not np.allclose(stored[i], originals[t]) for i, t in enumerate(meta.column("text").to_pylist())]
    assert any(pooled) and not all(pooled)  # a cluster of several sentences moved; a lone one did not


# ---------------------------------------------------------------- atomic publish


def _staged_copy(src, tmp_path, name):
    staging = tmp_path / f".{name}.tmp-test"
    shutil.copytree(src, staging)
    (staging / "manifest.json").unlink()
    data = json.loads((src / "manifest.json").read_text())
    return staging, IndexDescription.model_validate(
        {k: v for k, v in data.items() if k not in ("files", "index_version", "format_version")})


@pytest.mark.integration
def test_publish_replaces_old_index_atomically(kinds_index, sentence_cli_index, tmp_path):
    old_src, _ = kinds_index
    new_src = sentence_cli_index[0]
    out = tmp_path / "idx"
    shutil.copytree(old_src, out)
    staging, data = _staged_copy(new_src, tmp_path, "idx")
    written = write_manifest(staging, data)
    publish(staging, out)
    assert load_manifest(out, verify=True).index_version == written.index_version
    assert not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # the old index was removed, nothing left over


@pytest.mark.integration
def test_publish_refuses_unverified_staging(kinds_index, sentence_cli_index, tmp_path):
    old_src, _ = kinds_index
    out = tmp_path / "idx"
    shutil.copytree(old_src, out)
    before = load_manifest(out).index_version
    staging, data = _staged_copy(sentence_cli_index[0], tmp_path, "idx")
    write_manifest(staging, data)
    (staging / shard_meta(0)).write_bytes(b"half written")
    with pytest.raises(IndexFormatError, match="checksum mismatch"):
        publish(staging, out)
    assert load_manifest(out, verify=True).index_version == before  # old index untouched and valid


@pytest.mark.integration
def test_staging_dir_is_not_an_index(kinds_index, tmp_path):
    """A build killed mid-write leaves `.OUTPUT.tmp-*`: it has no manifest until complete, so nothing
    loads it, and the published OUTPUT next to it is unaffected."""
    src, _ = kinds_index
    out = tmp_path / "idx"
    shutil.copytree(src, out)
    staging, _ = _staged_copy(src, tmp_path, "idx")
    with pytest.raises(IndexFormatError, match="not a qrag index"):
        load_manifest(staging)
    assert load_manifest(out, verify=True).path == out
