"""A shard's dense search restricted to the rows a filter selected, exact in what it returns: the index's
own top k among the selected rows whenever k rows pass. The cost strategy follows the selection's size,
never the contract: few selected rows are scored directly (their stored vectors reconstructed, one matrix
product); more are searched by FAISS with an ID selector in its search parameters (IVF, HNSW, flat and
scalar-quantizer indexes, and Refine / PreTransform wrappers of them honour one, checked on the installed
FAISS: docs/SERVING.md); and a query the index could not fill (an IVF whose probed lists hold fewer
selected rows than asked, an HNSW walk that met too few) is answered again exhaustively."""

from __future__ import annotations

import faiss
import numpy as np

from qrag_ray.errors import QragError

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


def selector_params(index, sel, keep: list, exhaustive: bool = False):
    """Search parameters carrying `sel` for `index` and the indexes it wraps, each keeping the index's
    own settings (nprobe, efSearch, k_factor); `exhaustive` probes every IVF list. None: the index type
    takes no selector. `keep` holds the Python objects FAISS only points to until the search is done."""
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        inner = selector_params(index.index, sel, keep, exhaustive)
        p = None if inner is None else faiss.SearchParametersPreTransform(index_params=inner, sel=sel)
    elif isinstance(index, faiss.IndexRefine):
        inner = selector_params(index.base_index, sel, keep, exhaustive)
        p = None if inner is None else faiss.IndexRefineSearchParameters(k_factor=index.k_factor, sel=sel)
        if p is not None:
            p.base_index_params = inner
    elif isinstance(index, faiss.IndexIVF):
        p = faiss.SearchParametersIVF(sel=sel, nprobe=index.nlist if exhaustive else index.nprobe,
                                      max_codes=0 if exhaustive else index.max_codes)
    elif isinstance(index, faiss.IndexHNSW):
        p = faiss.SearchParametersHNSW(sel=sel, efSearch=index.hnsw.efSearch)
    elif isinstance(index, (faiss.IndexFlatCodes,)) and not isinstance(index, faiss.IndexFastScan):
        p = faiss.SearchParameters(sel=sel)
    else:
        return None
    keep.append(p)
    return p


def brute_force(index, qvecs: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows) of the k best of `rows` per query by inner product with their stored vectors."""
    vecs = index.reconstruct_batch(rows)
    scores = qvecs @ vecs.T
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < len(rows) else np.tile(np.arange(len(rows)), (len(qvecs), 1))
    best = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -best), axis=1)  # score desc, then row: a deterministic order
    top = np.take_along_axis(top, order, axis=1)
    return np.take_along_axis(best, order, axis=1).astype(np.float32), rows[top]


def search_selected(index, qvecs: np.ndarray, k: int, selection, reconstructs: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k (at most selection.count) best selected rows per query (`selection`: a shard_index.Selection):
    (scores, rows), rows -1 past the end."""
    n, dim = selection.count, qvecs.shape[1]
    k = min(k, n)
    if n * dim <= BRUTE_FORCE_VALUES and reconstructs:
        return brute_force(index, qvecs, selection.rows, k)
    keep: list = []
    bitmap = selection.bitmap()
    sel = faiss.IDSelectorBitmap(index.ntotal, faiss.swig_ptr(bitmap))
    params = selector_params(index, sel, keep)
    try:
        if params is None:
            raise RuntimeError("no selector")
        scores, found = index.search(qvecs, k, params=params)
    except RuntimeError:  # an index type that takes no selector: its stored vectors, or a clear error
        if not reconstructs:
            raise QragError(f"a filter cannot search this FAISS index type ({type(faiss.downcast_index(index)).__name__}):"
                            " it takes no ID selector and does not return its vectors; re-index with Flat, HNSW "
                            "or IVF") from None
        return brute_force(index, qvecs, selection.rows, k)
    short = np.flatnonzero(found[:, k - 1] < 0)
    if len(short):
        again = (brute_force(index, qvecs[short], selection.rows, k) if reconstructs else
                 index.search(qvecs[short], k, params=selector_params(index, sel, keep, exhaustive=True)))
        scores[short], found[short] = again
    del keep, sel, bitmap  # FAISS is done with them
    return scores, found
