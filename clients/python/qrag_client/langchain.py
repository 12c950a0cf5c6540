"""A LangChain retriever over a qrag server (`qrag-client[langchain]`): sync and async, `k`, `filter` and
`doc_ids` as fields and per call (`retriever.invoke(q, k=3, filter={...})`).

Each chunk is a Document(id=chunk_id, page_content=text, metadata=...): the chunk's own metadata fields,
then doc_id, title, url, score, cosine, bm25, the matched generated question (`matched_question`), the
best match's kind and text, the index and its version (SearchResult.flat_metadata)."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import Field, PrivateAttr, SecretStr

from qrag_client.client import DEFAULT_URL, AsyncQragClient, QragClient, RetryPolicy
from qrag_client.models import Filter, SearchResponse


def to_documents(page: SearchResponse) -> list[Document]:
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
        async with AsyncQragClient(**self._options()) as c:
            return to_documents(await c.search(query, **self._search_args(k, filter, doc_ids)))
