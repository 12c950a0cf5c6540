"""One shard of an index, opened and searched, the same in `qrag search`, `qrag eval`, the Router and every
ShardSearcher replica: its FAISS index and each row's chunk, kind and text, its BM25 lexicon, its chunks'
metadata as Arrow columns, and the selections of its recent filters. `search_shards` is the one entry point
of a search: each shard's own top k made final, then each shard's reply with the page metadata of the
chunks that can still reach a page."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qrag_ray.config.search_policy import QUESTION_KINDS
from qrag_ray.errors import IndexFormatError
from qrag_ray.index.faiss_search import (
    Selection,
    can_reconstruct,
    open_faiss,
    search_selected,
    set_faiss_threads,
    stored_vectors,
)
from qrag_ray.index.file_checks import manifest_now, verify_once
from qrag_ray.index.format import CHUNKS, Manifest, chunk_key, files_under, read_table_file, shard_of
from qrag_ray.index.lexical import ShardLexicon
from qrag_ray.index.metadata_columns import METADATA, URL, json_values
from qrag_ray.index.write_state import read_write_state
from qrag_ray.runtime.byte_lru import ByteLRU
from qrag_ray.search.filters import Filter, chunk_mask
from qrag_ray.search.merge import ChunkResult, Hits, merge_hits
from qrag_ray.search.page import ChunkMeta
from qrag_ray.search.query import QueryBatch, Tombstones
from qrag_ray.search.shard_reply import ShardReply, finish_replies

# A hybrid query's first round asks each shard for at least this many vectors and BM25 hits: a chunk
# one list missed is scored at that list's floor, and a short list's floor sinks it (docs/EVALUATION.md).
HYBRID_MIN_DEPTH = 100
# A shard keeps the selections of its most recent filters, room for this many (one bit per FAISS row and
# one byte per BM25 document each: under 1% of a shard's own bytes), so queries that repeat a filter, as an
# application's do (a permission group, a language), skip evaluating it on every shard.
SELECTIONS_KEPT = 8
_CHUNK_COLUMNS = ["chunk_id", "doc_id", "title", "text"]


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without a copy when the file held it as one."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def py_values(column: pa.Array, positions: list[int]) -> list:
    """The column's values at `positions` as Python objects: a few (a page's) read one by one, since a
    `take` kernel call has a fixed cost that they do not repay; many in one take."""
    if len(positions) < 8:
        return [column[position].as_py() for position in positions]
    return column.take(pa.array(positions, pa.int64())).to_pylist()


def _without(hits: Hits, hidden: np.ndarray) -> Hits:
    """`hits` without those of the `hidden` chunks (vector and BM25 alike), in the same order."""
    shown = ~np.isin(hits.chunk_idx, hidden)
    lex_scores = hits.lex_scores
    lex_chunk_idx = hits.lex_chunk_idx
    if lex_chunk_idx is not None:
        lex_shown = ~np.isin(lex_chunk_idx, hidden)
        lex_scores = lex_scores[lex_shown]
        lex_chunk_idx = lex_chunk_idx[lex_shown]
    kinds = None if hits.kinds is None else hits.kinds[shown]
    return Hits(hits.shard, hits.scores[shown], hits.rows[shown], hits.chunk_idx[shown], hits.exhausted, kinds,
                lex_scores, lex_chunk_idx)


def shard_of_chunk(chunk_id: str, num_shards: int) -> tuple[int, int]:
    """(chunk_idx, the shard that holds it): the build's one placement rule, for fetching a chunk by id."""
    chunk_idx = chunk_key(chunk_id)
    return chunk_idx, shard_of(chunk_idx, num_shards)


def initial_multiplier(manifest: Manifest) -> int:
    """Vectors to ask per wanted chunk: about twice the mean vectors per chunk."""
    counts = manifest.counts
    per_chunk = (counts.vectors if counts else 1) / max(1, counts.chunks if counts else 1)
    return max(2, math.ceil(2 * per_chunk))


def _rows_of_chunks(row_chunks: np.ndarray, chunk_idx: np.ndarray) -> tuple[str, np.ndarray]:
    """How a bool per chunk (in `chunk_idx` order) becomes one per row: the build writes a shard's rows
    grouped by chunk in key order, so ("counts", rows per chunk) for np.repeat; rows in another order:
    ("positions", each row's chunk) for a gather."""
    ordered = len(row_chunks) < 2 or bool((row_chunks[1:] >= row_chunks[:-1]).all())
    if ordered:
        counts = np.searchsorted(row_chunks, chunk_idx, "right") - np.searchsorted(row_chunks, chunk_idx, "left")
        if int(counts.sum()) == len(row_chunks):
            return "counts", counts
    return "positions", np.searchsorted(chunk_idx, row_chunks).astype(np.int32)


class Shard:
    """One opened shard: the FAISS index (each row's chunk_idx, kind and text beside it, columnar and
    memory-mapped as the file holds them), the BM25 lexicon when the index has one, and the shard's chunk
    table (chunk_idx sorted, with chunk id, doc id, title, text, url and typed metadata columns)."""

    def __init__(self, manifest: Manifest, number: int, threads: int | None = None, verify: bool = True,
                 use_gpu: bool = False):
        """Open (and with `verify` check the sha256 of) shard `number`: a file already checked in this process
        and unchanged since is not hashed again (index/file_checks.py)."""
        if number >= manifest.num_shards:
            raise IndexFormatError(f"index {manifest.path} has {manifest.num_shards} shards, no shard {number}")
        entry = manifest.shard(number)
        table_file = entry.chunk_table or CHUNKS  # earlier indexes: this shard's rows of chunks.parquet
        bm25_files = files_under(manifest, entry.bm25) if entry.bm25 else []
        if verify:
            verify_once(manifest, [entry.faiss, entry.meta, table_file, *bm25_files])
        self.number = number
        self.index_version = manifest.index_version
        self.multiplier = initial_multiplier(manifest)
        # OpenMP's thread count is the calling thread's own setting: a search run in a worker thread (a Serve
        # replica's, the Router's) would use every core, and on a shared box OpenMP's waiting threads spin; so
        # each search sets it in the thread that runs it
        self.threads = threads
        self._set_threads()
        self.faiss = open_faiss(manifest.file(entry.faiss), manifest, use_gpu)
        rows = read_table_file(manifest.file(entry.meta), ["chunk_idx", "kind", "text"])
        self.row_chunks = rows.column("chunk_idx").to_numpy()
        if len(self.row_chunks) != self.faiss.ntotal:
            raise IndexFormatError(f"shard {number} of {manifest.path}: {self.faiss.ntotal} vectors but "
                                   f"{len(self.row_chunks)} row records")
        kinds = one_array(rows.column("kind"))
        kinds = kinds if pa.types.is_dictionary(kinds.type) else kinds.dictionary_encode()
        self._kind_names = np.asarray(kinds.dictionary.to_pylist() + [""], dtype=object)
        codes = kinds.indices.to_numpy(zero_copy_only=False).astype(np.int32)
        self._kind_codes = np.append(codes, np.int32(len(self._kind_names) - 1))  # row -1 -> ""
        self.row_texts = one_array(rows.column("text"))
        self.lexicon = ShardLexicon(manifest.file(entry.bm25)) if entry.bm25 else None
        if entry.chunk_table:
            table = read_table_file(manifest.file(table_file))  # written sorted by chunk_idx
        else:
            table = pq.read_table(manifest.file(CHUNKS), filters=[("shard", "=", number)]).sort_by("chunk_idx")
        self.chunk_idx = table.column("chunk_idx").to_numpy()
        self.chunk_columns = [one_array(table.column(name)) for name in _CHUNK_COLUMNS]
        self.url = one_array(table.column(URL)) if URL in table.column_names else None
        self.metadata = one_array(table.column(METADATA)) if METADATA in table.column_names else None
        faiss_bytes = manifest.file(entry.faiss).stat().st_size  # the FAISS index as held in memory
        self.nbytes = (faiss_bytes + self.row_chunks.nbytes + self._kind_codes.nbytes + self.row_texts.nbytes
                       + sum(os.path.getsize(manifest.file(name)) for name in bm25_files) + int(table.nbytes))
        self._reconstructs: bool | None = None  # decided on the first filtered search
        self._rows_of_chunks: tuple[str, np.ndarray] | None = None  # how a chunk mask becomes a row mask (ditto)
        self._lex_chunk_positions: np.ndarray | None = None
        per_selection = self.ntotal // 8 + 1 + (len(self.lexicon) if self.lexicon is not None else 0)
        self._selections = ByteLRU(SELECTIONS_KEPT * per_selection)  # Filter -> Selection
        self._hidden: tuple[tuple, np.ndarray] | None = None  # (its write state, seq) -> its hidden chunk keys
        self._lock = threading.Lock()

    @classmethod
    def open(cls, index: str | Path | Manifest, number: int, threads: int | None = None, verify: bool = True,
             use_gpu: bool = False) -> Shard:
        """Shard `number` of the index at `index` (a directory holding manifest.json, or its Manifest)."""
        manifest = index if isinstance(index, Manifest) else manifest_now(index)
        return cls(manifest, number, threads, verify, use_gpu)

    @property
    def ntotal(self) -> int:
        """The shard's vectors."""
        return int(self.faiss.ntotal)

    def _set_threads(self) -> None:
        if self.threads:
            set_faiss_threads(self.threads)

    # ---- search ---------------------------------------------------------------------------------
    def select(self, flt: Filter) -> Selection:
        """The rows and BM25 documents of this shard's chunks that pass `flt` (one vectorised pass, or the
        selection kept from a recent query with an equal filter: a Selection is never changed)."""
        with self._lock:
            selection = self._selections.get(flt)
        if selection is None:
            selection = self._selection(chunk_mask(flt, self.chunk_columns[1], self.metadata))
            with self._lock:
                self._selections.put(flt, selection, selection.nbytes)
        return selection

    def hidden_chunks(self, tombstones: Tombstones | None) -> np.ndarray | None:
        """The keys (sorted) of this shard's chunks whose documents a later write hid (replaced or deleted),
        read from the root's write state, computed once per state of it; None when none are."""
        if tombstones is None:
            return None
        state = read_write_state(tombstones.root)
        if state is None:
            return None
        identity = (tombstones.root, state.generation, state.base_version, tombstones.segment_seq)
        with self._lock:
            kept = self._hidden
        if kept is not None and kept[0] == identity:
            return kept[1]
        documents = state.hidden(tombstones.segment_seq)
        hidden = None
        if documents:
            mask = pc.is_in(self.chunk_columns[1], value_set=pa.array(sorted(documents), pa.string()))
            chunks = self.chunk_idx[np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))]
            hidden = np.sort(chunks) if len(chunks) else None
        with self._lock:
            self._hidden = (identity, hidden)
        return hidden

    def _selection(self, passes: np.ndarray) -> Selection:
        """The rows (and BM25 documents) of the chunks that pass: `passes` is a bool per chunk of the table."""
        if self._rows_of_chunks is None:
            self._rows_of_chunks = _rows_of_chunks(self.row_chunks, self.chunk_idx)
        how, layout = self._rows_of_chunks
        if not len(passes):
            mask = np.zeros(self.ntotal, bool)
        else:
            mask = np.repeat(passes, layout) if how == "counts" else passes[layout]
        lex_docs = None
        if self.lexicon is not None:
            if self._lex_chunk_positions is None:
                self._lex_chunk_positions = np.searchsorted(self.chunk_idx, self.lexicon.chunk_idx).astype(np.int32)
            lex_docs = passes[self._lex_chunk_positions] if len(passes) else np.zeros(len(self.lexicon), bool)
        return Selection(np.packbits(mask, bitorder="little"), int(np.count_nonzero(mask)), len(mask), lex_docs)

    def nearest(self, vectors: np.ndarray, k: int, texts: list[str] | None = None,
                selection: Selection | None = None) -> list[Hits]:
        """Each query's k nearest vectors (among the selected rows with `selection`), and with `texts` (the
        queries' words) its k best BM25 chunks: one FAISS call for the batch."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self._set_threads()
        total = self.ntotal if selection is None else selection.count
        if total:
            if selection is None:
                scores, rows = self.faiss.search(vectors, max(1, min(k, total)))
            else:
                if self._reconstructs is None:
                    self._reconstructs = can_reconstruct(self.faiss)
                scores, rows = search_selected(self.faiss, vectors, max(1, k), selection, self._reconstructs)
        else:
            scores = np.zeros((len(vectors), 0), np.float32)
            rows = np.full((len(vectors), 0), -1, np.int64)
        chunk_idx = np.where(rows >= 0, self.row_chunks[np.clip(rows, 0, None)], -1)
        kinds = self._kind_names[self._kind_codes[rows]]
        lex_scores = lex_chunk_idx = None
        if texts is not None and self.lexicon is not None:
            lex_docs = None if selection is None else selection.lex_docs
            lex_scores, lex_chunk_idx = self.lexicon.search(texts, k, lex_docs)
        return [Hits(self.number, scores[j], rows[j], chunk_idx[j], k >= total, kinds[j],
                     None if lex_scores is None else lex_scores[j],
                     None if lex_chunk_idx is None else lex_chunk_idx[j]) for j in range(len(vectors))]

    def search(self, vectors: np.ndarray, batch: QueryBatch) -> tuple[list[Hits], list[list[ChunkResult]], int]:
        """Each query's hits, deep enough that the shard's own top k distinct chunks are final (widening x4
        while `needs_more` says so), with that top k where the widening or the page rule read it (else
        empty) and the widening rounds the deepest query needed. A
        chunk's vectors all live in one shard, so the global top k are among the shards' own top k: the
        caller merges once. With a filter all of it holds among the selected rows: a pre-filter, k chunks
        whenever k pass."""
        selection = None if batch.filter is None else self.select(batch.filter)
        hidden = self.hidden_chunks(batch.tombstones)
        total = self.ntotal if selection is None else selection.count
        texts = list(batch.texts) if batch.policy.bm25_alpha is not None and batch.texts is not None else None
        hits: list[Hits | None] = [None] * len(vectors)
        tops: list[list[ChunkResult]] = [[] for _ in range(len(vectors))]
        pending = np.arange(len(vectors))
        multiplier = self.multiplier if texts is None else max(self.multiplier, -(-HYBRID_MIN_DEPTH // batch.k))
        tops_decide = batch.policy.fusion == "max" and batch.policy.bm25_alpha is None  # group_winners reads them
        rounds = 0
        while len(pending):
            rounds += 1
            depth = batch.k * multiplier
            found = self.nearest(vectors[pending], depth, None if texts is None else [texts[i] for i in pending],
                                 selection)
            wider = depth < total
            again = []
            for query, query_hits in zip(pending.tolist(), found, strict=True):
                # hits of documents a later write replaced or deleted are left out: a list may come back
                # shorter than asked, and one that lost hits so is searched deeper until k chunks remain
                dropped = False
                if hidden is not None:
                    asked = len(query_hits.rows)
                    query_hits = _without(query_hits, hidden)
                    dropped = len(query_hits.rows) < asked
                top, more = [], False
                if wider or tops_decide or dropped:
                    top, more = merge_hits([query_hits], batch.k, batch.min_score, batch.policy)
                if wider and (more or (dropped and len(top) < batch.k)):
                    again.append(query)
                else:
                    hits[query] = query_hits
                    tops[query] = top
            pending = np.asarray(again, dtype=np.int64)
            multiplier *= 4
        return hits, tops, rounds  # type: ignore[return-value]

    # ---- what a page and the fetch routes read ------------------------------------------------------
    def _positions(self, chunk_idx: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(the chunks of `chunk_idx` this shard holds, their positions in its chunk table)."""
        wanted = np.asarray(list(chunk_idx), dtype=np.int64)
        if not len(self.chunk_idx) or not len(wanted):
            return wanted[:0], wanted[:0]
        positions = np.minimum(np.searchsorted(self.chunk_idx, wanted), len(self.chunk_idx) - 1)
        held = self.chunk_idx[positions] == wanted
        return wanted[held], positions[held]

    def fetch_chunks(self, chunk_idx: Sequence[int]) -> dict[int, ChunkMeta]:
        """chunk_idx -> its metadata, for chunks this shard holds (every one asked for, else IndexFormatError)."""
        chunk_idx = list(chunk_idx)
        found, positions = self._positions(chunk_idx)
        if len(found) != len(chunk_idx):
            raise IndexFormatError(f"chunk(s) missing from the chunk table of shard {self.number}")
        rows = positions.tolist()
        columns = [py_values(column, rows) for column in self.chunk_columns]
        columns.append(py_values(self.url, rows) if self.url is not None else [None] * len(rows))
        columns.append(json_values(py_values(self.metadata, rows)) if self.metadata is not None else [{}] * len(rows))
        records = zip(*columns, strict=True)
        return {int(key): ChunkMeta(*values) for key, values in zip(found.tolist(), records, strict=True)}

    def fetch_rows(self, rows: Sequence[int]) -> dict[int, tuple[str, str]]:
        """row -> (its vector's kind, its text), for rows of this shard."""
        rows = [int(row) for row in rows]
        kinds = self._kind_names[self._kind_codes[rows]].tolist()
        return dict(zip(rows, zip(kinds, py_values(self.row_texts, rows), strict=True), strict=True))

    def fetch_vectors(self, rows: Sequence[int]) -> dict[int, list[float] | None]:
        """row -> its stored vector (None for each where the index keeps no full vectors: an IVF without a
        direct map, PQ codes)."""
        rows = [int(row) for row in rows]
        if self._reconstructs is None:
            self._reconstructs = can_reconstruct(self.faiss)
        if not rows or not self._reconstructs:
            return dict.fromkeys(rows)
        vectors = stored_vectors(self.faiss, np.asarray(rows, dtype=np.int64)).astype(np.float32)
        return {row: vector.tolist() for row, vector in zip(rows, vectors, strict=True)}

    def fetch_records(self, chunk_idx: Sequence[int] | None = None, doc_id: str | None = None) -> list[dict]:
        """The records of this shard's chunks with these keys, or of document `doc_id` (absent ones left
        out): {chunk_id, doc_id, title, text, url, metadata, questions}, what the fetch routes return."""
        if doc_id is not None:
            same = pc.fill_null(pc.equal(self.chunk_columns[1], pa.scalar(doc_id, pa.string())), False)
            keys = self.chunk_idx[np.flatnonzero(same.to_numpy(zero_copy_only=False))].tolist()
        else:
            keys = self._positions(chunk_idx or [])[0].tolist()
        records = []
        for key, meta in self.fetch_chunks(keys).items():
            texts = self.fetch_rows(np.flatnonzero(self.row_chunks == key).tolist())
            questions = [text for kind, text in texts.values() if kind in QUESTION_KINDS]
            records.append({**meta._asdict(), "questions": list(dict.fromkeys(questions))})
        return records


def search_shards(shards: Sequence[Shard], vectors: np.ndarray, batch: QueryBatch, pool: Executor | None = None,
                  travels: bool = False) -> list[ShardReply]:
    """The one search of a group of shards (one replica's, or an index's in process): each shard's own
    final hits for every query (in `pool`'s threads when given: FAISS releases the GIL), then each shard's
    reply, carrying the page metadata of its chunks that can still reach a page of the batch (the group's
    own top k where that decides the page, else every chunk fewer than k of the group beat), so the caller
    merges and formats without asking again. A reply that `travels` (to another process) carries only the
    hits the caller's merge reads; one read in this process keeps them all (nothing to copy)."""
    def timed(shard: Shard) -> tuple[tuple[list[Hits], list[list[ChunkResult]], int], float]:
        started = time.perf_counter()
        found = shard.search(vectors, batch)
        return found, (time.perf_counter() - started) * 1000

    timed_searches = [timed(shard) for shard in shards] if pool is None else list(pool.map(timed, shards))
    started = time.perf_counter()
    replies = finish_replies(shards, [found for found, _ in timed_searches], batch, travels)
    finish_ms = (time.perf_counter() - started) * 1000
    for reply, (_, search_ms) in zip(replies, timed_searches, strict=True):
        reply.search_ms = search_ms + finish_ms
    return replies
