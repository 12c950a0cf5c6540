"""The rows and columns a build passes between its stages (documents -> chunks -> LLM requests ->
vector rows): pure functions over dicts and numpy columns that the UDFs in udfs.py call per batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from qrag_ray.config.index import IndexConfig
from qrag_ray.errors import QragError
from qrag_ray.generation.parsing import parse_atoms, parse_output
from qrag_ray.index.format import chunk_key, shard_of
from qrag_ray.index.representations import vector_rows
from qrag_ray.text.chunking import chunk_document
from qrag_ray.text.sentences import split_sentences

# the chunks table of the published chunks.parquet (+ the typed url and metadata columns of an index whose
# documents have them: qrag_ray.index.metadata_columns)
CHUNK_SCHEMA = pa.schema([("chunk_idx", pa.int64()), ("chunk_id", pa.string()), ("doc_id", pa.string()),
                          ("title", pa.string()), ("text", pa.string()), ("shard", pa.int32())])
# the work dir's chunk parts: the document's url and metadata (canonical JSON) as text, "" for none
CHUNK_PART_SCHEMA = CHUNK_SCHEMA.append(pa.field("url", pa.string())).append(pa.field("metadata", pa.string()))
# a generated row's position in its chunk: after every base row, grouped by the request's unit
GEN_ORD_BASE = 100_000
_CHUNK_COLUMNS = {"chunk_id": object, "doc_id": object, "title": object, "text": object, "chunk_idx": np.int64,
                  "shard": np.int32, "url": object, "metadata": object}
_VECTOR_COLUMNS = {"chunk_idx": np.int64, "shard": np.int32, "kind": object, "text": object, "embed_text": object,
                   "qn": np.int32, "ord": np.int32, "store": bool}
_REQUEST_COLUMNS = {"key": object, "output": object, "unit": np.int32, "atom": object, "chunk_idx": np.int64,
                    "shard": np.int32, "text": object}  # and messages


def vector_schema(dim: int) -> pa.Schema:
    """The embedded vector rows of the work dir's vector parts."""
    return pa.schema([("chunk_idx", pa.int64()), ("kind", pa.string()), ("text", pa.string()), ("qn", pa.int32()),
                      ("ord", pa.int32()), ("store", pa.bool_()), ("row_key", pa.int64()),
                      ("vector", pa.list_(pa.float32(), dim))])


def check_unique_chunks(chunk_idx: np.ndarray, chunk_id) -> None:
    """A corpus error: two chunks with one id (so one key)."""
    _, first, counts = np.unique(chunk_idx, return_index=True, return_counts=True)
    if (counts > 1).any():
        bad = str(chunk_id[int(first[np.flatnonzero(counts > 1)[0]])])
        raise QragError(f"duplicate document id: chunk {bad!r} occurs twice (document ids must be unique)")


def rows_of(batch: dict) -> list[dict]:
    """A numpy batch as one dict per row (array cells as lists)."""
    count = len(next(iter(batch.values()))) if batch else 0
    return [{k: (v[i].tolist() if isinstance(v[i], np.ndarray) else v[i]) for k, v in batch.items()}
            for i in range(count)]


def _object_column(values: list) -> np.ndarray:
    """Cells that are lists or dicts stay whole (np.asarray would make a 2-d array of them)."""
    return np.fromiter(values, dtype=object, count=len(values))


def chunk_rows(doc: dict, cfg: IndexConfig) -> list[dict]:
    """A document's chunks, each with its key, its shard, the document's url and metadata and its
    precomputed questions."""
    rows = list(chunk_document(doc, cfg.chunker))
    for chunk in rows:
        chunk["chunk_idx"] = chunk_key(chunk["chunk_id"])
        chunk["shard"] = shard_of(chunk["chunk_idx"], cfg.shards)
        chunk["url"] = doc.get("url") or ""
        chunk["metadata"] = doc.get("metadata") or ""
        if "questions" in doc:
            chunk["questions"] = list(doc["questions"])
    return rows


def chunk_columns(rows: list[dict], with_questions: bool) -> dict:
    """Chunk rows as the numpy columns of the chunk stage's output."""
    cols = {k: np.asarray([r[k] for r in rows], dtype=t) for k, t in _CHUNK_COLUMNS.items()}
    if with_questions:
        cols["questions"] = _object_column([r.get("questions", []) for r in rows])
    return cols


def atoms_of(chunk: dict, cfg: IndexConfig) -> list[str]:
    """The chunk's atomic statements: the LLM's when it atomized the chunk, else its sentences."""
    if cfg.generator.atoms == "llm" and chunk.get("atoms") is not None:
        return [a for a in list(chunk["atoms"]) if a]
    return split_sentences(chunk["text"])


def base_vector_rows(chunk: dict, kinds: list[str], cfg: IndexConfig, aux_questions: bool) -> list[dict]:
    """Chunk, sentence and window rows (no LLM needed); precomputed questions join here too."""
    sentences = atoms_of(chunk, cfg) if {"sentence", "window"} & set(kinds) else None
    questions = list(chunk.get("questions") or []) if cfg.generator.backend == "precomputed" else []
    return vector_rows(chunk, kinds, questions, sentences, aux_questions=aux_questions and bool(questions),
                       title=chunk.get("title"), title_prefix=cfg.title_prefix)


def question_vector_rows(row: dict, kinds: list[str], aux_questions: bool) -> list[dict]:
    """Vector rows for the questions of one answered request (no chunk row: base rows have it)."""
    questions = parse_output(row.get("raw") or "", row.get("output") or "questions") if row.get("raw") else []
    questions = [q if isinstance(q, str) else q[0] for q in questions]
    rows = vector_rows(row, kinds, questions, None, aux_questions=aux_questions, atom=row.get("atom") or None)
    unit = int(row.get("unit", -1))  # qn becomes unique per chunk across atoms
    return [r | {"qn": (unit + 1) * 1000 + r["qn"]} if r["qn"] >= 0 else r for r in rows if r["kind"] != "chunk"]


def vector_columns(rows: list[dict]) -> dict:
    """Vector rows as numpy columns (the embed stage's input)."""
    return {c: np.asarray([r[c] for r in rows], dtype=t) for c, t in _VECTOR_COLUMNS.items()}


def base_vector_columns(chunks: list[dict], kinds: list[str], cfg: IndexConfig, aux_questions: bool) -> dict:
    """The base rows of some chunks, each numbered by its place in its chunk (`ord`)."""
    return vector_columns([v | {"ord": i} for c in chunks
                           for i, v in enumerate(base_vector_rows(c, kinds, cfg, aux_questions))])


def question_vector_columns(answered: list[dict], kinds: list[str], aux_questions: bool) -> dict:
    """The question rows of some answered requests, numbered after every base row of their chunk."""
    return vector_columns([v | {"ord": (int(r.get("unit", -1)) + 2) * GEN_ORD_BASE + i}
                           for r in answered for i, v in enumerate(question_vector_rows(r, kinds, aux_questions))])


def payload(chunk: dict) -> dict:
    """What a request carries of its chunk, so the answer finds its way back."""
    return {"chunk_idx": int(chunk["chunk_idx"]), "shard": int(chunk["shard"]), "text": chunk["text"]}


def request_columns(requests: list[dict]) -> dict:
    """LLM requests as numpy columns; messages travel as lists of {role, content} dicts."""
    out = {k: np.asarray([r.get(k, "") for r in requests], dtype=t) for k, t in _REQUEST_COLUMNS.items()}
    return out | {"messages": _object_column([[dict(m) for m in r["messages"]] for r in requests])}


def atom_columns(answered: dict) -> dict:
    """Answered atomize requests back as chunk columns with their atoms."""
    atoms = _object_column([parse_atoms(raw or "") for raw in answered["raw"]])
    return {"chunk_idx": answered["chunk_idx"], "shard": answered["shard"], "text": answered["text"], "atoms": atoms}
