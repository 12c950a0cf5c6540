"""LangChain over a qrag server (`qrag-client[langchain]`).

QragRetriever: a retriever, sync and async, `k`, `filter` and `doc_ids` as fields and per call
(`retriever.invoke(q, k=3, filter={...})`). Each chunk is a Document(id=chunk_id, page_content=text,
metadata=...): the chunk's own metadata fields, then doc_id, title, url, score, cosine, bm25, the matched
generated question (`matched_question`), the best match's kind and text, the index and its version
(SearchResult.flat_metadata).

QragVectorStore: a tenant's index as a LangChain VectorStore (a write key adds and deletes). A Document
added is one qrag document: its id (given, else a new UUID), its text, its metadata (the index's metadata
types: strings, numbers, bools, ISO-8601 dates, lists of strings). The server chunks and embeds it with
its index's model, so the store has no Embeddings (`embeddings` is None). A search returns a Document per
matching chunk: id = the document's id (what add_documents returned, what delete takes), page_content = the
chunk's text, metadata = the document's metadata as written; a document longer than the index's chunks
can come back once per matching chunk. get_by_ids returns one Document per id found, its chunks joined
back in order (GET /v1/documents/{id})."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore
from pydantic import Field, PrivateAttr, SecretStr

from qrag_client.client import DEFAULT_URL, AsyncQragClient, QragClient, RetryPolicy
from qrag_client.errors import NotFoundError
from qrag_client.models import Document as QragDocument
from qrag_client.models import DocumentResponse, Filter, SearchResponse, SearchResult


def to_documents(page: SearchResponse) -> list[Document]:
    """The page's chunks as retriever Documents, in its order (see the module's docstring)."""
    return [Document(id=r.chunk_id, page_content=r.text, metadata=r.flat_metadata(page.index, page.index_version))
            for r in page.results]


class QragRetriever(BaseRetriever):
    """The top `k` chunks /v1/search returns for a query, best first, as Documents."""

    url: str = DEFAULT_URL
    api_key: SecretStr | None = None
    k: int = Field(4, ge=1, description="chunks per query (a call's own `k` overrides it)")
    filter: Filter | None = Field(None, description="metadata filter (docs/SERVING.md's grammar)")
    doc_ids: list[str] | None = Field(None, description="only chunks of these documents")
    index: str | None = None
    min_score: float | None = None
    bm25_alpha: float | None = None
    timeout: float = 60.0
    max_retries: int = 2
    _client: QragClient | None = PrivateAttr(None)

    def _options(self) -> dict[str, Any]:
        key = self.api_key.get_secret_value() if self.api_key else None
        return {"url": self.url, "api_key": key, "timeout": self.timeout,
                "retry": RetryPolicy(max_retries=self.max_retries)}

    def _search_args(self, k: int | None, filter: Filter | None, doc_ids: list[str] | None) -> dict[str, Any]:
        return {"k": self.k if k is None else k, "filter": self.filter if filter is None else filter,
                "doc_ids": self.doc_ids if doc_ids is None else doc_ids, "index": self.index,
                "min_score": self.min_score, "bm25_alpha": self.bm25_alpha}

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, filter: Filter | None = None,
                                doc_ids: list[str] | None = None) -> list[Document]:
        if self._client is None:  # one connection pool per retriever (httpx.Client is thread-safe)
            self._client = QragClient(**self._options())
        return to_documents(self._client.search(query, **self._search_args(k, filter, doc_ids)))

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, filter: Filter | None = None,
                                       doc_ids: list[str] | None = None) -> list[Document]:
        # a client per call: an httpx.AsyncClient belongs to the event loop it was made on
        async with AsyncQragClient(**self._options()) as client:
            return to_documents(await client.search(query, **self._search_args(k, filter, doc_ids)))


class QragVectorStore(VectorStore):
    """A qrag tenant's index as a LangChain vector store (see the module's docstring). `wait` (default
    True): a write returns once a search sees it (at most `wait_timeout` seconds, else WriteTimeoutError);
    False returns when the server has taken it (durable, searchable a moment later). `batch_size`: the
    documents one request carries. Searches take `filter` (the search filter's grammar, docs/SERVING.md)
    and `doc_ids`, `min_score`, `bm25_alpha` as keyword arguments, also through `as_retriever(search_kwargs=
    {...})` and per call. `client_options` go to the clients (headers, transport)."""

    def __init__(self, url: str = DEFAULT_URL, api_key: str | None = None, *, index: str | None = None,
                 wait: bool = True, wait_timeout: float = 60.0, batch_size: int = 100, timeout: float = 60.0,
                 max_retries: int = 2, **client_options: Any):
        self.url = url
        self.index = index
        self.wait = wait
        self.wait_timeout = wait_timeout
        self.batch_size = batch_size
        self._options: dict[str, Any] = {"url": url, "api_key": api_key, "timeout": timeout,
                                         "retry": RetryPolicy(max_retries=max_retries), **client_options}
        self._client: QragClient | None = None

    @property
    def embeddings(self) -> Embeddings | None:
        """None: the server embeds, with its index's model."""
        return None

    @property
    def client(self) -> QragClient:
        """The QragClient the store's synchronous calls go through (one connection pool)."""
        if self._client is None:
            self._client = QragClient(**self._options)
        return self._client

    def _async_client(self) -> AsyncQragClient:
        # a client per call: an httpx.AsyncClient belongs to the event loop it was made on
        return AsyncQragClient(**self._options)

    # ---- writes
    def add_texts(self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
                  ids: list[str | None] | None = None, wait: bool | None = None, **kwargs: Any) -> list[str]:
        """Write the texts as documents (upsert by id: a new id for each text without one); their ids."""
        documents = _documents(texts, metadatas, ids)
        receipts = [self.client.upsert(batch, index=self.index) for batch in _batches(documents, self.batch_size)]
        if self.wait if wait is None else wait:
            for receipt in receipts:
                self.client.wait_until_searchable(receipt, timeout=self.wait_timeout)
        return [d.id for d in documents]

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
                         ids: list[str | None] | None = None, wait: bool | None = None, **kwargs: Any) -> list[str]:
        """`add_texts`, awaited."""
        documents = _documents(texts, metadatas, ids)
        async with self._async_client() as client:
            batches = _batches(documents, self.batch_size)
            receipts = [await client.upsert(batch, index=self.index) for batch in batches]
            if self.wait if wait is None else wait:
                for receipt in receipts:
                    await client.wait_until_searchable(receipt, timeout=self.wait_timeout)
        return [d.id for d in documents]

    def delete(self, ids: list[str] | None = None, *, filter: Filter | None = None, wait: bool | None = None,
               **kwargs: Any) -> bool:
        """Delete these documents (ids the index does not hold are no error), or every document the filter
        passes; one of the two (qrag has no delete-everything). True once taken (searchable with `wait`)."""
        receipt = self.client.delete(**_delete_selector(ids, filter), index=self.index)
        if self.wait if wait is None else wait:
            self.client.wait_until_searchable(receipt, timeout=self.wait_timeout)
        return True

    async def adelete(self, ids: list[str] | None = None, *, filter: Filter | None = None, wait: bool | None = None,
                      **kwargs: Any) -> bool:
        """`delete`, awaited."""
        async with self._async_client() as client:
            receipt = await client.delete(**_delete_selector(ids, filter), index=self.index)
            if self.wait if wait is None else wait:
                await client.wait_until_searchable(receipt, timeout=self.wait_timeout)
        return True

    # ---- reads
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """One Document per id the index holds (the rest are left out), its chunks joined back in order."""
        found = []
        for doc_id in ids:
            try:
                found.append(_whole_document(self.client.document(doc_id, index=self.index)))
            except NotFoundError:
                continue
        return found

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """`get_by_ids`, awaited."""
        found = []
        async with self._async_client() as client:
            for doc_id in ids:
                try:
                    found.append(_whole_document(await client.document(doc_id, index=self.index)))
                except NotFoundError:
                    continue
        return found

    def similarity_search(self, query: str, k: int = 4, filter: Filter | None = None,
                          **kwargs: Any) -> list[Document]:
        """The k best chunks for the query, best first."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter, **kwargs)]

    async def asimilarity_search(self, query: str, k: int = 4, filter: Filter | None = None,
                                 **kwargs: Any) -> list[Document]:
        """`similarity_search`, awaited."""
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, filter=filter, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: Filter | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """The k best chunks with the server's score (a similarity: higher is closer; the cosine for a
        dense index)."""
        page = self.client.search(query, k, filter=filter, index=self.index, **kwargs)
        return [(_chunk_document(r), r.score) for r in page.results]

    async def asimilarity_search_with_score(self, query: str, k: int = 4, filter: Filter | None = None,
                                            **kwargs: Any) -> list[tuple[Document, float]]:
        """`similarity_search_with_score`, awaited."""
        async with self._async_client() as client:
            page = await client.search(query, k, filter=filter, index=self.index, **kwargs)
        return [(_chunk_document(r), r.score) for r in page.results]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return similarity_to_relevance

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: Filter | None = None, **kwargs: Any) -> list[Document]:
        """k of the fetch_k best chunks, chosen for relevance and diversity (maximal marginal relevance,
        `lambda_mult` 1: relevance only, 0: diversity only) over the vectors the server returns
        (include_vectors): no embedder here."""
        page = self.client.search(query, max(k, fetch_k), filter=filter, index=self.index, include_vectors=True,
                                  **kwargs)
        return _mmr(page, k, lambda_mult)

    async def amax_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                             lambda_mult: float = 0.5, filter: Filter | None = None,
                                             **kwargs: Any) -> list[Document]:
        """`max_marginal_relevance_search`, awaited."""
        async with self._async_client() as client:
            page = await client.search(query, max(k, fetch_k), filter=filter, index=self.index,
                                       include_vectors=True, **kwargs)
        return _mmr(page, k, lambda_mult)

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None,
                   metadatas: list[dict[str, Any]] | None = None, *, ids: list[str] | None = None,
                   url: str = DEFAULT_URL, api_key: str | None = None, **kwargs: Any) -> QragVectorStore:
        """A store over the server at `url` (the tenant of `api_key`, a write key), the texts added.
        `embedding` must be None: the server embeds with its index's model."""
        _no_embedding(embedding)
        store = cls(url, api_key, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings | None = None,
                          metadatas: list[dict[str, Any]] | None = None, *, ids: list[str] | None = None,
                          url: str = DEFAULT_URL, api_key: str | None = None, **kwargs: Any) -> QragVectorStore:
        """`from_texts`, awaited."""
        _no_embedding(embedding)
        store = cls(url, api_key, **kwargs)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store


def similarity_to_relevance(score: float) -> float:
    """A cosine similarity (-1..1) as LangChain's relevance score (0..1)."""
    return min(1.0, max(0.0, (score + 1.0) / 2.0))


def _no_embedding(embedding: Embeddings | None) -> None:
    if embedding is not None:
        raise ValueError("QragVectorStore takes no embedding: the qrag server embeds with its index's model "
                         "(pass embedding=None)")


def _documents(texts: Iterable[str], metadatas: list[dict[str, Any]] | None,
               ids: list[str | None] | None) -> list[QragDocument]:
    texts = list(texts)
    for name, given in (("metadatas", metadatas), ("ids", ids)):
        if given is not None and len(given) != len(texts):
            raise ValueError(f"{len(given)} {name} for {len(texts)} texts")
    return [QragDocument(id=(ids[i] if ids and ids[i] else str(uuid.uuid4())), text=text,
                         metadata=dict(metadatas[i]) if metadatas else {})
            for i, text in enumerate(texts)]


def _batches(documents: list[QragDocument], size: int) -> list[list[QragDocument]]:
    return [documents[start:start + size] for start in range(0, len(documents), size)]


def _delete_selector(ids: list[str] | None, filter: Filter | None) -> dict[str, Any]:
    if (ids is None) == (filter is None):
        raise ValueError("give ids or filter (one of the two): qrag has no delete-everything")
    return {"ids": list(ids)} if ids is not None else {"filter": filter}


def _chunk_document(result: SearchResult) -> Document:
    return Document(id=result.doc_id, page_content=result.text, metadata=dict(result.metadata))


def _whole_document(doc: DocumentResponse) -> Document:
    return Document(id=doc.doc_id, page_content=doc.text, metadata=dict(doc.metadata))


def _mmr(page: SearchResponse, k: int, lambda_mult: float) -> list[Document]:
    try:
        import numpy as np
        from langchain_core.vectorstores.utils import maximal_marginal_relevance
    except ImportError as error:
        raise ImportError(f"max_marginal_relevance_search needs numpy ({error}): "
                          "pip install 'qrag-client[langchain]'") from None
    if not page.results:
        return []
    if page.query_vector is None or any(r.vector is None for r in page.results):
        raise ValueError("the server returned no vectors (include_vectors): it predates the vector-store routes")
    chosen = maximal_marginal_relevance(np.array(page.query_vector, dtype=np.float32),
                                        [r.vector for r in page.results], lambda_mult=lambda_mult, k=k)
    return [_chunk_document(page.results[i]) for i in chosen]
