"""A shard's FAISS index as searched: opened with the settings it was built with (nprobe, efSearch, a
Refine's k_factor), its OpenMP threads set in the thread that searches, and the dense search restricted to
the rows a filter selected, exact in what it returns: the index's own top k among the selected rows whenever
k rows pass. The cost strategy follows the selection's size, never the contract: few selected rows are
scored directly (their stored vectors reconstructed, one matrix product); more are searched by FAISS with an
ID selector in its search parameters (IVF, HNSW, flat and scalar-quantizer indexes, and Refine / PreTransform
wrappers of them honour one, checked on the installed FAISS: docs/SERVING.md); and a query the index could
not fill (an IVF whose probed lists hold fewer selected rows than asked, an HNSW walk that met too few) is
answered again exhaustively. An IVF probes nprobe / (the selected share) lists, all at most: as many selected
rows as an unfiltered search scans, as an index of only the selected rows would, so a filter costs no recall
the unfiltered search has."""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from qrag_ray.config.index import FaissConfig, recorded_config
from qrag_ray.errors import IndexFormatError, QragError
from qrag_ray.index.format import Manifest

# A Refine index re-ranks k_factor x k candidates with its exact codes; left at FAISS's 1 it re-ranks
# only the k it returns, and PQ codes alone rank near neighbours poorly (docs/SCALING.md section 1).
REFINE_K_FACTOR = 64
_CORES = os.cpu_count() or 1  # read once: set_faiss_threads runs before every search


def faiss_settings(manifest: Manifest) -> FaissConfig:
    """The FAISS search settings the index was built with (nprobe, efSearch), at FaissConfig's defaults where
    its recorded config has none; a setting only a newer release knows is left to that release."""
    recorded = recorded_config(manifest.config).get("faiss") or {}
    return FaissConfig.model_validate({name: value for name, value in recorded.items()
                                       if name in FaissConfig.model_fields})


def set_faiss_threads(threads: int) -> None:
    """FAISS's OpenMP threads for the calling thread (OpenMP keeps the count per thread): `threads` (a
    task's or replica's CPUs), at most this node's cores: a local Ray can declare more logical CPUs than
    there are cores, and threads beyond the cores wait on each other."""
    faiss.omp_set_num_threads(max(1, min(int(threads), _CORES)))


def open_faiss(path: Path, manifest: Manifest, use_gpu: bool = False):
    """A shard's FAISS file, read with the search settings its index was built with (on the GPU with
    `use_gpu` where FAISS has one)."""
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as error:
        raise IndexFormatError(f"cannot read {path}: {error}") from None
    settings = faiss_settings(manifest)
    with contextlib.suppress(RuntimeError, ValueError):  # not an IVF index
        faiss.extract_index_ivf(index).nprobe = settings.nprobe
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = settings.hnsw_ef_search
    if isinstance(index, faiss.IndexRefine):
        index.k_factor = REFINE_K_FACTOR
    if use_gpu and faiss.get_num_gpus() > 0:
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    return index


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
        """The selected rows, sorted."""
        if self._rows is None:
            mask = np.unpackbits(self.bits, count=self.ntotal, bitorder="little")
            self._rows = np.flatnonzero(mask).astype(np.int64)
        return self._rows

    @property
    def nbytes(self) -> int:
        """What the selection holds in memory (a cache counts it)."""
        return sum(array.nbytes for array in (self.bits, self.lex_docs, self._rows) if array is not None)


# Score the selected rows directly up to this many stored values (rows x dim: 8 MB of float32); beyond it
# a FAISS search with a selector costs less than reconstructing the rows.
BRUTE_FORCE_VALUES = 1 << 21


def can_reconstruct(index) -> bool:
    """The index returns its stored vectors (flat, SQ, HNSW storage, a Refine's refinement index); an IVF
    without a direct map does not."""
    if index.ntotal == 0:
        return False
    try:
        index.reconstruct(0)
    except RuntimeError:
        return False
    return True


def selector_params(index, sel, keep: list, widen: float = 1.0):
    """Search parameters carrying `sel` for `index` and the indexes it wraps, each keeping the index's
    own settings (efSearch, k_factor); an IVF probes `widen` times its nprobe lists (every list at most;
    math.inf: all of them). None: the index type takes no selector. `keep` holds the Python objects FAISS
    only points to until the search is done."""
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        inner = selector_params(index.index, sel, keep, widen)
        params = None if inner is None else faiss.SearchParametersPreTransform(index_params=inner, sel=sel)
    elif isinstance(index, faiss.IndexRefine):
        inner = selector_params(index.base_index, sel, keep, widen)
        params = None if inner is None else faiss.IndexRefineSearchParameters(k_factor=index.k_factor, sel=sel)
        if params is not None:
            params.base_index_params = inner
    elif isinstance(index, faiss.IndexIVF):
        nprobe = index.nlist if widen == math.inf else min(index.nlist, math.ceil(index.nprobe * widen))
        max_codes = 0 if widen == math.inf else index.max_codes
        params = faiss.SearchParametersIVF(sel=sel, nprobe=nprobe, max_codes=max_codes)
    elif isinstance(index, faiss.IndexHNSW):
        params = faiss.SearchParametersHNSW(sel=sel, efSearch=index.hnsw.efSearch)
    elif isinstance(index, (faiss.IndexFlatCodes,)) and not isinstance(index, faiss.IndexFastScan):
        params = faiss.SearchParameters(sel=sel)
    else:
        return None
    keep.append(params)
    return params


def _codes_index(index):
    """The index whose code array holds what `index` returns from reconstruct (the refinement index of a
    Refine, the storage of an HNSW, a flat-codes index itself), or None."""
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexRefine):
        return _codes_index(index.refine_index)
    if isinstance(index, faiss.IndexHNSW):
        return _codes_index(index.storage)
    return index if isinstance(index, faiss.IndexFlatCodes) else None


def stored_vectors(index, rows: np.ndarray) -> np.ndarray:
    """The stored vectors of `rows` (what reconstruct returns): from a flat-codes index its codes of those
    rows decoded in one call (a view of the code array, no copy of it), which costs a fraction of FAISS's
    reconstruct_batch (one virtual call per row); any other index through reconstruct_batch."""
    flat = _codes_index(index)
    if flat is None:
        return index.reconstruct_batch(rows)
    codes = faiss.rev_swig_ptr(flat.codes.data(), flat.codes.size()).reshape(flat.ntotal, flat.code_size)
    return flat.sa_decode(codes[rows])


def brute_force(index, qvecs: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows) of the k best of `rows` per query by inner product with their stored vectors."""
    scores = qvecs @ stored_vectors(index, rows).T
    if k < len(rows):
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        top = np.tile(np.arange(len(rows)), (len(qvecs), 1))
    best = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -best), axis=1)  # score desc, then row: a deterministic order
    top = np.take_along_axis(top, order, axis=1)
    return np.take_along_axis(best, order, axis=1).astype(np.float32), rows[top]


def search_selected(index, qvecs: np.ndarray, k: int, selection, reconstructs: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k (at most selection.count) best selected rows per query (`selection`: a Selection):
    (scores, rows), rows -1 past the end."""
    n, dim = selection.count, qvecs.shape[1]
    k = min(k, n)
    if n * dim <= BRUTE_FORCE_VALUES and reconstructs:
        return brute_force(index, qvecs, selection.rows, k)
    keep: list = []
    sel = faiss.IDSelectorBitmap(index.ntotal, faiss.swig_ptr(selection.bits))  # `selection` keeps the bits
    params = selector_params(index, sel, keep, widen=index.ntotal / n)
    try:
        if params is None:
            raise RuntimeError("no selector")
        scores, found = index.search(qvecs, k, params=params)
    except RuntimeError:  # an index type that takes no selector: its stored vectors, or a clear error
        if not reconstructs:
            index_type = type(faiss.downcast_index(index)).__name__
            raise QragError(f"a filter cannot search this FAISS index type ({index_type}):"
                            " it takes no ID selector and does not return its vectors; re-index with Flat, HNSW "
                            "or IVF") from None
        return brute_force(index, qvecs, selection.rows, k)
    short = np.flatnonzero(found[:, k - 1] < 0)
    if len(short):
        again = (brute_force(index, qvecs[short], selection.rows, k) if reconstructs else
                 index.search(qvecs[short], k, params=selector_params(index, sel, keep, widen=math.inf)))
        scores[short], found[short] = again
    del keep, sel  # FAISS is done with them
    return scores, found
