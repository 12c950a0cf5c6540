"""The build's pure row and column builders (qrag_ray.index.rows): what each stage hands the next,
checked without Ray or a model."""

from __future__ import annotations

import numpy as np

from qrag_ray.config.index import IndexConfig
from qrag_ray.index.format import chunk_key, shard_of
from qrag_ray.index.rows import (
    GEN_ORD_BASE,
    atom_columns,
    base_vector_columns,
    chunk_columns,
    chunk_rows,
    payload,
    question_vector_columns,
    request_columns,
    rows_of,
    vector_columns,
)

CFG = IndexConfig(representation="chunk+sentence", shards=3, chunker={"method": "none"})
DOC = {"doc_id": "loops", "title": "Loops", "text": "Loops run. A break ends them.", "questions": ["What ends a loop?"]}


def test_chunk_rows_key_place_and_carry_the_questions():
    (row,) = chunk_rows(DOC, CFG)
    assert row["chunk_idx"] == chunk_key(row["chunk_id"]) and row["shard"] == shard_of(row["chunk_idx"], 3)
    assert row["questions"] == ["What ends a loop?"] and row["doc_id"] == "loops"
    assert "questions" not in chunk_rows({k: v for k, v in DOC.items() if k != "questions"}, CFG)[0]


def test_chunk_columns_keep_each_question_list_whole():
    rows = chunk_rows(DOC, CFG) + chunk_rows(DOC | {"doc_id": "two", "questions": ["Why?"]}, CFG)
    cols = chunk_columns(rows, with_questions=True)
    assert cols["chunk_idx"].dtype == np.int64 and cols["shard"].dtype == np.int32
    assert cols["questions"].shape == (2,) and list(cols["questions"]) == [["What ends a loop?"], ["Why?"]]
    assert "questions" not in chunk_columns(rows, with_questions=False)
    assert rows_of(cols)[1]["doc_id"] == "two"


def test_base_vector_columns_number_rows_within_their_chunk():
    chunks = chunk_rows(DOC, CFG) + chunk_rows(DOC | {"doc_id": "b", "text": "One sentence only."}, CFG)
    cols = base_vector_columns(chunks, ["chunk", "sentence"], CFG, aux_questions=False)
    assert list(cols["kind"]) == ["chunk", "sentence", "sentence", "chunk", "sentence"]
    assert list(cols["ord"]) == [0, 1, 2, 0, 1]
    assert list(cols["embed_text"][1:3]) == ["Loops run.", "A break ends them."]
    assert {c: cols[c].dtype for c in ("chunk_idx", "qn", "ord", "store")} == {
        "chunk_idx": np.int64, "qn": np.int32, "ord": np.int32, "store": bool}


def test_vector_columns_of_no_rows_keep_their_types():
    cols = vector_columns([])
    assert all(len(v) == 0 for v in cols.values()) and cols["chunk_idx"].dtype == np.int64


def test_question_vector_columns_come_after_the_base_rows_and_skip_the_chunk():
    answered = [{"chunk_idx": 7, "shard": 1, "text": "Loops run.", "unit": 2, "output": "questions", "atom": "",
                 "raw": "1. What does a for loop repeat?\n2. Which statement ends a loop early?"},
                {"chunk_idx": 7, "shard": 1, "text": "Loops run.", "unit": 3, "output": "questions", "atom": "",
                 "raw": ""}]
    cols = question_vector_columns(answered, ["chunk", "question"], aux_questions=False)
    assert list(cols["kind"]) == ["question", "question"]
    assert list(cols["text"]) == ["What does a for loop repeat?", "Which statement ends a loop early?"]
    assert list(cols["qn"]) == [3000, 3001]  # unique per chunk across atoms
    assert list(cols["ord"]) == [4 * GEN_ORD_BASE, 4 * GEN_ORD_BASE + 1]


def test_requests_travel_as_columns_and_atoms_come_back():
    chunk = {"chunk_idx": 5, "shard": 2, "text": "T", "title": "x"}
    reqs = [{"key": "k1", "messages": [{"role": "user", "content": "hi"}], "output": "atoms", "unit": -1}
            | payload(chunk)]
    cols = request_columns(reqs)
    assert cols["messages"].shape == (1,) and cols["messages"][0] == [{"role": "user", "content": "hi"}]
    assert cols["unit"].dtype == np.int32 and cols["chunk_idx"][0] == 5 and cols["atom"][0] == ""
    back = atom_columns({"chunk_idx": cols["chunk_idx"], "shard": cols["shard"], "text": cols["text"],
                         "raw": np.asarray(["1. Loops repeat their body.\n2. A break statement ends a loop.", None],
                                           dtype=object)[:1]})
    assert list(back["atoms"][0]) == ["Loops repeat their body.", "A break statement ends a loop."]
    assert set(back) == {"chunk_idx", "shard", "text", "atoms"}


def test_chunk_parts_carry_metadata_and_the_build_types_it(tmp_path):
    """A batch's parts keep each chunk's url and metadata as text and register their field types; the
    driver merges the parts' types (one per field) and each shard's chunk table gets typed columns."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    import pytest

    from qrag_ray.errors import QragError
    from qrag_ray.index import workdir
    from qrag_ray.index.metadata_columns import chunk_table, json_values
    from qrag_ray.index.rows import CHUNK_PART_SCHEMA
    from qrag_ray.index.tasks import metadata_fields
    from qrag_ray.index.udfs import write_chunk_part
    from qrag_ray.io.readers import normalize_record

    cfg = IndexConfig(input="x", shards=1)
    docs = [normalize_record({"id": "a", "text": "one two", "url": "https://x.org/a", "metadata": {"n": 1}}, "f"),
            normalize_record({"id": "b", "text": "three", "metadata": {"n": 2.5, "day": "2024-01-02"}}, "f")]
    cols = chunk_columns([r for d in docs for r in chunk_rows(d, cfg)], False)
    write_chunk_part(cols, 2, tmp_path, "run1")
    (part,) = workdir.registered_parts(tmp_path, "run1")
    assert part["metadata"] == {"n": ["number", "a"], "day": ["date", "b"]} and part["url"]
    fields = metadata_fields([part, {"metadata": {"lang": ["string", "c"]}}])
    assert fields == {"schema": {"day": "date", "lang": "string", "n": "number"}, "url": True}
    with pytest.raises(QragError, match="document 'd': metadata field 'n' is a string, but document 'a'"):
        metadata_fields([part, {"metadata": {"n": ["string", "d"]}}])
    def shard0_rows(part):  # a part's rows of shard 0, read as the shard task reads them
        return pa.concat_tables(workdir.read_row_groups(workdir.shard_row_groups([part], 0), CHUNK_PART_SCHEMA.names,
                                                        0))

    table = chunk_table(shard0_rows(next((tmp_path / "chunks").rglob("*.parquet"))).sort_by("doc_id"), **fields)
    assert table.column("url").to_pylist() == ["https://x.org/a", None]
    assert json_values(table.column("metadata").to_pylist()) == [{"n": 1}, {"n": 2.5, "day": "2024-01-02"}]
    plain = normalize_record({"id": "c", "text": "four"}, "f")
    write_chunk_part(chunk_columns(chunk_rows(plain, cfg), False), 1, tmp_path, "run2")
    (part,) = workdir.registered_parts(tmp_path, "run2")
    assert part["metadata"] == {} and not part["url"]
    files = sorted((tmp_path / "chunks").rglob("*.parquet"))
    untyped = [chunk_table(shard0_rows(f)) for f in files]
    assert len(untyped) == len(files) >= 2
    assert all(t.column_names == ["chunk_idx", "chunk_id", "doc_id", "title", "text", "shard"] for t in untyped)
    metadata = [m for f in files for m in pq.read_table(f).column("metadata").to_pylist() if m]
    assert metadata and all(json.loads(m) for m in metadata)
