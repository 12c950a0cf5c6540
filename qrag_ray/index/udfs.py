"""The Ray Data UDFs of the build's stream: each turns one numpy batch into the next stage's columns
(the logic is in qrag_ray.index.rows); the chunker and the embedding sink also write checkpoint parts
into the work dir, so a killed build resumes from them. Each UDF carries the label of its operator's row in
the progress display (qrag_ray.runtime.progress.operator_label)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa

from qrag_ray.config.index import IndexConfig
from qrag_ray.embedding import Forward, load_sentence_transformer
from qrag_ray.embedding.forward import default_tokens_per_batch
from qrag_ray.embedding.tokens import token_ids
from qrag_ray.generation.requests import atomize_request, question_requests
from qrag_ray.index import workdir
from qrag_ray.index.format import atomic_write_parquet, atomic_write_text
from qrag_ray.index.rows import (
    CHUNK_PART_SCHEMA,
    atom_columns,
    atoms_of,
    base_vector_columns,
    check_unique_chunks,
    chunk_columns,
    chunk_rows,
    payload,
    question_vector_columns,
    request_columns,
    rows_of,
    vector_schema,
)
from qrag_ray.io.metadata import field_types
from qrag_ray.runtime.progress import operator_label

# rows whose key is a multiple of this also go to work/sample, where a large build draws its training sample
SAMPLE_STRIPE = 1024


def make_chunker(cfg: IndexConfig, work: Path, run: str, deleted: frozenset, with_questions: bool):
    """Documents -> chunk rows; every batch also lands as chunk parts in the work dir."""

    @operator_label("chunker")
    def chunker(batch: dict) -> dict:
        started = time.perf_counter()
        docs = [d for d in rows_of(batch) if str(d["doc_id"]) not in deleted]
        cols = chunk_columns([r for d in docs for r in chunk_rows(d, cfg)], with_questions)
        if docs:
            write_chunk_part(cols, len(docs), work, run, seconds=time.perf_counter() - started)
        return cols

    return chunker


def write_chunk_part(cols: dict, n_docs: int, work: Path, run: str, seconds: float = 0.0) -> None:
    """Write one batch's chunk rows as one part (workdir.write_part: a row group per shard), named by
    content (a retried or resumed batch rewrites the same file), and register it for this run with its
    documents' metadata field types (the build merges them into the index's schema). Duplicate chunk ids
    are caught here inside a batch, by the shard task across batches."""
    ids = np.asarray(cols["chunk_idx"], np.int64)
    check_unique_chunks(ids, cols["chunk_id"])
    table = pa.table({k: pa.array(cols[k] if k in ("chunk_idx", "shard") else list(cols[k]),
                                  type=CHUNK_PART_SCHEMA.field(k).type) for k in CHUNK_PART_SCHEMA.names})
    docs = dict(zip(cols["doc_id"], cols["metadata"], strict=True))
    fields = field_types((d, json.loads(m)) for d, m in docs.items() if m)
    content = (ids.tobytes() + "".join(table.column("text").to_pylist()).encode() + str(n_docs).encode()
               + "".join(m for m in cols["metadata"] if m).encode() + "".join(u for u in cols["url"] if u).encode())
    name = hashlib.blake2b(content, digest_size=10).hexdigest()
    shards = sorted(set(table.column("shard").to_pylist()))
    workdir.write_part(table, work / "chunks" / f"{name}.parquet")
    atomic_write_text(workdir.run_registry(work, run) / f"{name}.json",
                      json.dumps({"part": name, "documents": n_docs, "chunks": len(ids), "shards": shards,
                                  "seconds": round(seconds, 4), "metadata": fields,
                                  "url": any(bool(u) for u in cols["url"])}))


def make_base_rows(kinds: list[str], cfg: IndexConfig, aux_questions: bool):
    """Chunk rows -> the rows to embed that need no LLM (chunk, sentence, window, precomputed questions)."""

    @operator_label("base")
    def base(batch: dict) -> dict:
        return base_vector_columns(rows_of(batch), kinds, cfg, aux_questions)

    return base


def make_atomize_requests(gcfg):
    """Chunk rows -> one atomize request per chunk."""
    @operator_label("atomize")
    def atomize(batch: dict) -> dict:
        return request_columns([atomize_request(r, gcfg) | payload(r) for r in rows_of(batch)])

    return atomize


@operator_label("attach_atoms")
def attach_atoms(batch: dict) -> dict:
    """Answered atomize requests -> chunk rows with their atoms."""
    return atom_columns(batch)


def make_question_requests(cfg: IndexConfig, granularity: str):
    """Chunk rows -> question requests, one per chunk or one per atom."""
    @operator_label("requests")
    def requests(batch: dict) -> dict:
        out = []
        for row in rows_of(batch):
            atoms = atoms_of(row, cfg) if granularity == "atom" else None
            out += [q | payload(row) for q in question_requests(row, atoms, cfg.generator, granularity)]
        return request_columns(out)

    return requests


def make_question_rows(kinds: list[str], aux_questions: bool):
    """Answered question requests -> the rows to embed for their questions."""

    @operator_label("questions")
    def questions(batch: dict) -> dict:
        return question_vector_columns(rows_of(batch), kinds, aux_questions)

    return questions


class EmbedSink:
    """Embeds the rows no earlier run embedded; returns per row whether it was embedded now, whether it
    is a question and its share of the seconds, never the vectors. A batch writes at most three files
    whatever the shard count (workdir.write_part): its row keys, its vectors and the sample stripe's.
    On the CPU every pass has the canonical shape (a resumed run gets the same bits); on a GPU passes
    are sized in tokens. Ray Data runs CONCURRENCY calls at once: the model takes one batch at a time
    (the lock) while another call's host work (row keys, Parquet parts) runs, so a GPU need not wait for
    it; a call returns once its own parts are written (a killed build resumes from exactly those). Rows
    done, batches in flight included, are counted in memory, and a thread of the actor writes them to a
    file of its own every NOTE_EVERY_S (see `progress_rows`): no file is written on the model's path."""

    CONCURRENCY = 2
    NOTE_EVERY_S = 0.25

    def __init__(self, model: str, batch_size: int, max_seq_length: int | None, threads: int | None,
                 work: str, question_kind: str | None, run: str, backend: str = "auto", dtype: str = "auto",
                 tokens_per_batch: int | None = None, device: str | None = None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        # device: the resource plan's (None: CUDA where there is one)
        self.model = load_sentence_transformer(model, device=device, max_seq_length=max_seq_length, backend=backend,
                                               threads=threads, dtype=dtype)
        on_gpu = str(self.model.device).startswith("cuda")
        self.forward = Forward(self.model, tokens_per_batch or default_tokens_per_batch(on_gpu),
                               canonical_rows=None if on_gpu else batch_size)
        self.work = Path(work)
        self.question_kind = question_kind
        self.run = run
        self.done = workdir.done_row_keys(self.work)
        self.model_lock = threading.Lock()  # one batch in the model at a time
        self.count_lock = threading.Lock()
        self.rows = 0  # rows done, batches in flight included
        self.noted = 0  # the count the progress file holds
        self.note = self.work / "runs" / run / "progress" / f"{os.getpid()}-{id(self)}"
        threading.Thread(target=_note_every, args=(weakref.ref(self),), daemon=True).start()

    def __call__(self, batch: dict) -> dict:
        started = time.perf_counter()
        count = len(batch["chunk_idx"])
        keys = workdir.row_keys(batch["chunk_idx"], batch["kind"], batch["ord"], batch["text"], batch["embed_text"])
        embedded = ~workdir.isin_sorted(keys, self.done)
        todo = np.flatnonzero(embedded)
        self._count(count - len(todo))
        if self.question_kind:
            question = (batch["kind"] == self.question_kind) & (batch["qn"] >= 0)
        else:
            question = np.zeros(count, bool)
        # this run's rows, reused or not: the shard keeps exactly these (an older corpus's rows stay out)
        workdir.write_part(pa.table({"row_key": keys, "shard": np.asarray(batch["shard"], np.int32)}),
                           workdir.run_keys_dir(self.work, self.run) / f"{workdir.part_name(keys)}.parquet")
        t_wait = time.perf_counter()
        with self.model_lock:  # the seconds leave out the wait for it (the other call's forward)
            started += time.perf_counter() - t_wait
            vecs = self._vectors(batch, todo) if len(todo) else None
        if vecs is not None:
            self._write_vectors(batch, keys, todo, vecs)
        return {"embedded": embedded, "question": np.asarray(question, bool),
                "seconds": np.full(count, (time.perf_counter() - started) / max(1, count))}

    def _vectors(self, batch: dict, todo: np.ndarray) -> np.ndarray:
        if "input_ids" in batch:
            return self.forward(batch["input_ids"][todo], batch["n_tokens"][todo], self._count)
        return self.forward(*token_ids(self.model.tokenizer, [str(batch["embed_text"][i]) for i in todo],
                                       int(self.model.max_seq_length or 512)), self._count)

    def _count(self, rows: int) -> None:
        with self.count_lock:
            self.rows += rows

    def write_note(self) -> None:
        """The rows done so far to this sink's progress file, if they changed since the last note."""
        with self.count_lock:
            rows = self.rows
        if rows != self.noted:
            atomic_write_text(self.note, str(rows))
            self.noted = rows

    def _write_vectors(self, batch: dict, keys: np.ndarray, todo: np.ndarray, vecs: np.ndarray) -> None:
        flat = pa.array(vecs.reshape(-1), type=pa.float32())
        cols = {c: batch[c][todo] for c in ("chunk_idx", "kind", "text", "qn", "ord")}
        table = pa.table({**cols, "store": batch["store"][todo].astype(bool), "row_key": keys[todo],
                          "vector": pa.FixedSizeListArray.from_arrays(flat, vecs.shape[1]),
                      "shard": np.asarray(batch["shard"][todo], np.int32)},
                         schema=vector_schema(vecs.shape[1]).append(pa.field("shard", pa.int32())))
        name = workdir.part_name(keys[todo])
        stripe = (keys[todo] % SAMPLE_STRIPE) == 0
        if stripe.any():  # the rows a large build trains its quantizer from (before the part: see sample_vectors)
            atomic_write_parquet(table.filter(pa.array(stripe)), self.work / "sample" / f"{name}.parquet")
        workdir.write_part(table, self.work / "vectors" / f"{name}.parquet")


def _note_every(sink_ref) -> None:
    """A sink's note thread: writes its count every NOTE_EVERY_S while the sink exists."""
    while (sink := sink_ref()) is not None:
        sink.write_note()
        every = sink.NOTE_EVERY_S
        del sink  # the thread must not keep the sink alive
        time.sleep(every)


def progress_rows(work: Path, run: str) -> int:
    """Rows the embedding actors have done so far, batches in flight included (for the display)."""
    total = 0
    for file in (Path(work) / "runs" / run / "progress").glob("[!.]*"):
        with contextlib.suppress(OSError, ValueError):  # an actor may be replacing its file
            total += int(file.read_text())
    return total
