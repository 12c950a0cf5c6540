"""One shard's index as searched (FAISS index, row -> chunk arrays, BM25), in-process and in every Serve
shard replica alike. Returns vector-level hits; dedup by chunk happens in qrag_ray.search.merge."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa

from qrag_ray.config.index import FaissConfig, recorded_config
from qrag_ray.errors import IndexFormatError
from qrag_ray.index.file_checks import verify_once
from qrag_ray.index.format import Manifest, files_under, load_manifest, read_table_file
from qrag_ray.index.lexical import ShardLexicon
from qrag_ray.index.selected_search import can_reconstruct, search_selected


@dataclass
class ShardHits:
    """Hits of one shard for a batch of queries: arrays shaped (n_queries, k); row -1 = no hit."""

    shard: int
    scores: np.ndarray
    rows: np.ndarray
    chunk_idx: np.ndarray
    exhausted: bool  # the shard holds no more vectors than were asked for
    kinds: np.ndarray | None = None  # vector kind per hit (object array), for kind-aware fusion
    # BM25 hits (n_queries, k_lex), raw scores and chunk ids (-1 = none), for query texts on a BM25 shard
    lex_scores: np.ndarray | None = None
    lex_chunk_idx: np.ndarray | None = None

    def row(self, j: int) -> "ShardHits":
        """Query j's hits alone (a 1-query ShardHits), so queries can be widened one by one."""
        pick = lambda a: None if a is None else a[j:j + 1]  # noqa: E731
        return ShardHits(self.shard, pick(self.scores), pick(self.rows), pick(self.chunk_idx), self.exhausted,
                         pick(self.kinds), pick(self.lex_scores), pick(self.lex_chunk_idx))


@dataclass
class Selection:
    """The part of one shard a filter lets through, as FAISS's selector reads it: one bit per FAISS row
    (packed little-endian, for faiss.IDSelectorBitmap), and with BM25 a bool per BM25 document; the
    sorted row ids derived on demand (the rows scored directly, when few pass)."""

    bits: np.ndarray
    count: int
    ntotal: int
    lex_docs: np.ndarray | None
    _rows: np.ndarray | None = None

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:
            mask = np.unpackbits(self.bits, count=self.ntotal, bitorder="little")
            self._rows = np.flatnonzero(mask).astype(np.int64)
        return self._rows

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.bits, self.lex_docs, self._rows) if a is not None)


def one_array(col: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without a copy when the file held it as one."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def py_values(col: pa.Array, pos: list[int]) -> list:
    """The column's values at `pos` as Python objects: a few (a page's) read one by one, since a `take`
    kernel call has a fixed cost that they do not repay; many in one take."""
    if len(pos) < 8:
        return [col[i].as_py() for i in pos]
    return col.take(pa.array(pos, pa.int64())).to_pylist()


def _rows_of_chunks(row_chunks: np.ndarray, chunk_keys: np.ndarray) -> tuple[str, np.ndarray]:
    """How a bool per chunk (in `chunk_keys` order) becomes one per row: the build writes a shard's rows
    grouped by chunk in key order, so ("counts", rows per chunk) for np.repeat; rows in another order:
    ("pos", each row's chunk) for a gather."""
    ordered = len(row_chunks) < 2 or bool((row_chunks[1:] >= row_chunks[:-1]).all())
    if ordered:
        counts = np.searchsorted(row_chunks, chunk_keys, "right") - np.searchsorted(row_chunks, chunk_keys, "left")
        if int(counts.sum()) == len(row_chunks):
            return "counts", counts
    return "pos", np.searchsorted(chunk_keys, row_chunks).astype(np.int32)


# A Refine index re-ranks k_factor x k candidates with its exact codes; left at FAISS's 1 it re-ranks
# only the k it returns, and PQ codes alone rank near neighbours poorly (docs/SCALING.md section 1).
REFINE_K_FACTOR = 64


def faiss_settings(manifest: Manifest) -> FaissConfig:
    """The FAISS search settings the index was built with (nprobe, efSearch), at FaissConfig's defaults where
    its recorded config has none; a setting only a newer release knows is left to that release."""
    recorded = recorded_config(manifest.config).get("faiss") or {}
    return FaissConfig.model_validate({k: v for k, v in recorded.items() if k in FaissConfig.model_fields})


_CORES = os.cpu_count() or 1  # read once: set_faiss_threads runs before every search


def set_faiss_threads(threads: int) -> None:
    """FAISS's OpenMP threads for the calling thread (OpenMP keeps the count per thread): `threads` (a
    task's or replica's CPUs), at most this node's cores: a local Ray can declare more logical CPUs than
    there are cores, and threads beyond the cores wait on each other."""
    faiss.omp_set_num_threads(max(1, min(int(threads), _CORES)))


class ShardIndex:
    def __init__(self, index_dir: str | Path, shard: int, manifest: Manifest | None = None,
                 verify: bool = True, threads: int | None = None, use_gpu: bool = False):
        self.manifest = manifest or load_manifest(index_dir)
        self.shard = shard
        info = self.manifest.shard(shard)
        if verify:
            verify_once(self.manifest, [info.faiss, info.meta])
        # OpenMP's thread count is the calling thread's own setting: a search run in a worker thread (a
        # Serve replica's, the Router's) would use every core, and on a shared box OpenMP's waiting threads
        # spin; so each search sets it in the thread that runs it (`_threads`)
        self.threads = threads
        self._threads()
        try:
            index = faiss.read_index(str(self.manifest.file(info.faiss)))
        except RuntimeError as e:
            raise IndexFormatError(f"cannot read shard {shard} of {self.manifest.path}: {e}") from None
        fcfg = faiss_settings(self.manifest)
        with contextlib.suppress(RuntimeError, ValueError):  # not an IVF index
            faiss.extract_index_ivf(index).nprobe = fcfg.nprobe
        if hasattr(index, "hnsw"):
            index.hnsw.efSearch = fcfg.hnsw_ef_search
        if isinstance(index, faiss.IndexRefine):
            index.k_factor = REFINE_K_FACTOR
        if use_gpu and faiss.get_num_gpus() > 0:
            index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
        self.index = index
        # Row metadata stays columnar, as the file holds it (memory-mapped): a kind code per vector and the
        # texts looked up by row (a Python string per vector costs ~57 bytes beyond its text).
        meta = read_table_file(self.manifest.file(info.meta), ["chunk_idx", "kind", "text"])
        self.chunk_idx = meta.column("chunk_idx").to_numpy()
        kinds = one_array(meta.column("kind"))
        kinds = kinds if pa.types.is_dictionary(kinds.type) else kinds.dictionary_encode()
        self._kind_names = np.asarray(kinds.dictionary.to_pylist() + [""], dtype=object)
        codes = kinds.indices.to_numpy(zero_copy_only=False).astype(np.int32)
        self._kind_code = np.append(codes, np.int32(len(self._kind_names) - 1))  # row -1 -> ""
        self.text = one_array(meta.column("text"))
        file_bytes = self.manifest.file(info.faiss).stat().st_size  # the FAISS index as held in memory
        self.nbytes = file_bytes + self.chunk_idx.nbytes + self._kind_code.nbytes + self.text.nbytes
        if len(self.chunk_idx) != index.ntotal:
            raise IndexFormatError(f"shard {shard}: {index.ntotal} vectors but {len(self.chunk_idx)} metadata rows")
        self._reconstructs: bool | None = None  # decided on the first filtered search
        self._rows_of_chunks: tuple[str, np.ndarray] | None = None  # how a chunk mask becomes a row mask (ditto)
        self._lex_chunk: np.ndarray | None = None
        self.lexicon = None
        if info.bm25:
            if verify:
                verify_once(self.manifest, files_under(self.manifest, info.bm25))
            self.lexicon = ShardLexicon(self.manifest.file(info.bm25))

    def _threads(self) -> None:
        if self.threads:
            set_faiss_threads(self.threads)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def selection(self, chunk_keys: np.ndarray, passes: np.ndarray) -> Selection:
        """The rows (and BM25 documents) of the chunks that pass: `passes` is a bool per chunk of the
        shard's chunk table, whose sorted keys are `chunk_keys`."""
        if self._rows_of_chunks is None:
            self._rows_of_chunks = _rows_of_chunks(self.chunk_idx, chunk_keys)
        how, arr = self._rows_of_chunks
        mask = np.repeat(passes, arr) if how == "counts" else passes[arr] if len(passes) else np.zeros(self.ntotal, bool)
        lex = None
        if self.lexicon is not None:
            if self._lex_chunk is None:
                self._lex_chunk = np.searchsorted(chunk_keys, self.lexicon.chunk_idx).astype(np.int32)
            lex = passes[self._lex_chunk] if len(passes) else np.zeros(len(self.lexicon), bool)
        return Selection(np.packbits(mask, bitorder="little"), int(np.count_nonzero(mask)), len(mask), lex)

    def search(self, qvecs: np.ndarray, k: int, queries: list[str] | None = None,
               sel: Selection | None = None) -> ShardHits:
        """The k nearest vectors per query; with `queries` (their texts) also the k best BM25 chunks;
        with `sel` only among the rows and chunks it selected (qrag_ray.index.selected_search)."""
        qvecs = np.ascontiguousarray(qvecs, dtype=np.float32)
        self._threads()
        total = self.ntotal if sel is None else sel.count
        if total:
            if sel is None:
                scores, rows = self.index.search(qvecs, max(1, min(k, total)))
            else:
                if self._reconstructs is None:
                    self._reconstructs = can_reconstruct(self.index)
                scores, rows = search_selected(self.index, qvecs, max(1, k), sel, self._reconstructs)
            cidx = np.where(rows >= 0, self.chunk_idx[np.clip(rows, 0, None)], -1)
            hits = ShardHits(self.shard, scores, rows, cidx, exhausted=k >= total,
                             kinds=self._kind_names[self._kind_code[rows]])
        else:
            empty = np.full((len(qvecs), 0), -1, np.int64)
            hits = ShardHits(self.shard, np.zeros((len(qvecs), 0), np.float32), empty, empty, True,
                             np.zeros((len(qvecs), 0), dtype=object))
        if queries is not None and self.lexicon is not None:
            hits.lex_scores, hits.lex_chunk_idx = self.lexicon.search(queries, k, None if sel is None else sel.lex_docs)
        return hits

    def matched(self, rows) -> dict[int, tuple[str, str]]:
        """row -> (its vector's kind, its text), for rows of this shard."""
        rows = [int(r) for r in rows]
        return dict(zip(rows, zip(self._kind_names[self._kind_code[rows]].tolist(), py_values(self.text, rows))))

