"""LlamaIndex over a qrag server (`qrag-client[llamaindex]`).

QragLlamaIndexRetriever: `retrieve` / `aretrieve` return one QragNodeWithScore per chunk, ranked as
/v1/search ranks them: the node a TextNode (id = chunk id, the chunk's text, the document as its SOURCE,
metadata = what belongs to the chunk whatever the query: its own metadata fields, chunk_id, doc_id, title,
url, index, index_version), the score on `score`, and this query's match beside it, on the NodeWithScore:
`cosine`, `bm25`, `matched_question`, `matched_kind`, `matched_text`. Nothing that changes from one query
to the next is in the node's metadata, because LlamaIndex identifies a node by its text and metadata
(`node.hash`): so one chunk found by two queries or two retrievers is one node, and QueryFusionRetriever
fuses its ranks and scores.

QragVectorStore: a BasePydanticVectorStore for `VectorStoreIndex.from_vector_store(store, ...)`; the
server stores the text and embeds it (`stores_text=True`, `is_embedding_query=False`).

LlamaIndex's MetadataFilters map onto the search filter: operators ==, !=, >, >=, <, <=, in, nin and the
conditions and/or, nested. Others (not, any, all, contains, text_match, is_empty) have no counterpart
in the search filter and are refused with UnsupportedFilterError (by the retriever when it is made)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import PrivateAttr, SecretStr
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)

from qrag_client.client import DEFAULT_URL, AsyncQragClient, QragClient, RetryPolicy
from qrag_client.errors import NotFoundError
from qrag_client.models import Document, Filter, SearchResponse, SearchResult

_OPERATORS = {FilterOperator.EQ: "eq", FilterOperator.NE: "ne", FilterOperator.GT: "gt", FilterOperator.GTE: "gte",
              FilterOperator.LT: "lt", FilterOperator.LTE: "lte", FilterOperator.IN: "in", FilterOperator.NIN: "nin"}
_CONDITIONS = {FilterCondition.AND: "and", FilterCondition.OR: "or"}
# what an LLM or an embedding sees of a node: its title and source, not our bookkeeping
_NOT_FOR_MODELS = ["chunk_id", "index", "index_version", "metadata"]


class UnsupportedFilterError(ValueError):
    """A MetadataFilters operator or condition the search filter cannot express."""


def to_qrag_filter(filters: MetadataFilters | MetadataFilter) -> Filter | None:
    """LlamaIndex filters as the search filter (None for an empty MetadataFilters)."""
    if isinstance(filters, MetadataFilter):
        operator = _OPERATORS.get(FilterOperator(filters.operator))
        if operator is None:
            raise UnsupportedFilterError(
                f"filter operator {FilterOperator(filters.operator).value!r} on {filters.key!r} is not supported by "
                f"qrag's search filter (supported: {', '.join(o.value for o in _OPERATORS)})")
        if (operator in ("in", "nin")) != isinstance(filters.value, list):
            takes = "takes a list of values" if operator in ("in", "nin") else "takes one value"
            raise UnsupportedFilterError(
                f"filter on {filters.key!r}: {FilterOperator(filters.operator).value!r} {takes}")
        return {"type": operator, "key": filters.key, "value": filters.value}
    condition = _CONDITIONS.get(FilterCondition(filters.condition or FilterCondition.AND))
    if condition is None:
        raise UnsupportedFilterError(f"filter condition {FilterCondition(filters.condition).value!r} is not "
                                     "supported by qrag's search filter (supported: and, or)")
    parts = [p for p in (to_qrag_filter(f) for f in filters.filters) if p is not None]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return {"type": condition, "filters": parts}


class QragNodeWithScore(NodeWithScore):
    """A chunk /v1/search returned: `node` and `score` as LlamaIndex has them, and how this query matched
    it, which is the query's and not the chunk's (so not in the node's metadata, which identifies it)."""

    cosine: float | None = None
    bm25: float | None = None
    matched_question: str | None = None
    matched_kind: str | None = None
    matched_text: str | None = None

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serialises it under."""
        return "QragNodeWithScore"


def to_nodes(page: SearchResponse) -> list[QragNodeWithScore]:
    """The page's chunks as LlamaIndex nodes, in its order (see the module's docstring)."""
    out = []
    for result in page.results:
        node = TextNode(id_=result.chunk_id, text=result.text,
                        metadata=result.chunk_metadata(page.index, page.index_version),
                        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=result.doc_id)},
                        excluded_llm_metadata_keys=list(_NOT_FOR_MODELS),
                        excluded_embed_metadata_keys=list(_NOT_FOR_MODELS))
        match = result.match_details()
        out.append(QragNodeWithScore(node=node, score=result.score, cosine=match["cosine"], bm25=match["bm25"],
                                     matched_question=match["matched_question"], matched_kind=match["matched_kind"],
                                     matched_text=match["matched_text"]))
    return out


class QragLlamaIndexRetriever(BaseRetriever):
    """The top `similarity_top_k` chunks of /v1/search. `filters`: LlamaIndex MetadataFilters (mapped
    and checked here), or a search filter as a dict (docs/SERVING.md's grammar, passed as it is)."""

    def __init__(self, url: str = DEFAULT_URL, api_key: str | None = None, *, similarity_top_k: int = 4,
                 filters: MetadataFilters | Filter | None = None, doc_ids: list[str] | None = None,
                 index: str | None = None, timeout: float = 60.0, max_retries: int = 2,
                 callback_manager: CallbackManager | None = None, verbose: bool = False):
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self.similarity_top_k = similarity_top_k
        self.filter = to_qrag_filter(filters) if isinstance(filters, (MetadataFilters, MetadataFilter)) else filters
        self.doc_ids = doc_ids
        self.index = index
        self._options: dict[str, Any] = {"url": url, "api_key": api_key, "timeout": timeout,
                                         "retry": RetryPolicy(max_retries=max_retries)}
        self._client: QragClient | None = None

    def _search_args(self) -> dict[str, Any]:
        return {"k": self.similarity_top_k, "filter": self.filter, "doc_ids": self.doc_ids, "index": self.index}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._client is None:
            self._client = QragClient(**self._options)
        return list(to_nodes(self._client.search(query_bundle.query_str, **self._search_args())))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        async with AsyncQragClient(**self._options) as client:  # an AsyncClient belongs to the loop it was made on
            return list(to_nodes(await client.search(query_bundle.query_str, **self._search_args())))


# the metadata field that records which LlamaIndex document (a node's ref_doc_id) a stored node came from
REF_DOC_FIELD = "ref_doc_id"
_SUPPORTED_MODES = (VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.HYBRID)


class QragLlamaIndexVectorStore(BasePydanticVectorStore):
    """A qrag tenant's index as a LlamaIndex vector store (a write key adds and deletes): each node is
    one qrag document (id = node id, its text, its metadata plus `ref_doc_id`, the LlamaIndex document
    it came from), which the server chunks, embeds and makes searchable; `add` waits until a search sees
    it unless `wait=False`. The server embeds with its index's model: the embeddings LlamaIndex computes
    on insert are not sent (give the index `embed_model=MockEmbedding(embed_dim=1)` to skip computing
    them), and a query is its text.

    A query's result is a node per chunk: id = the node's id (a node longer than the server's chunks
    comes back once per matching chunk), the chunk's text, the node's metadata, the score. `filters`
    (MetadataFilters) and `doc_ids` (ref_doc_ids) narrow it; `node_ids` keeps only those nodes;
    `mode=hybrid` with `alpha` (the dense weight, as the index's BM25 channel takes it) sets bm25_alpha.
    `delete(ref_doc_id)` removes every node of that document (a delete by filter). `client_options` go to
    the clients (headers, transport)."""

    stores_text: bool = True
    is_embedding_query: bool = False
    url: str = DEFAULT_URL
    index: str | None = None
    wait: bool = True
    wait_timeout: float = 60.0
    timeout: float = 60.0
    max_retries: int = 2
    _api_key: SecretStr | None = PrivateAttr(None)
    _client: QragClient | None = PrivateAttr(None)
    _client_options: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __init__(self, url: str = DEFAULT_URL, api_key: str | None = None, *, index: str | None = None,
                 wait: bool = True, wait_timeout: float = 60.0, timeout: float = 60.0, max_retries: int = 2,
                 **client_options: Any):
        super().__init__(url=url, index=index, wait=wait, wait_timeout=wait_timeout, timeout=timeout,
                         max_retries=max_retries)
        self._api_key = SecretStr(api_key) if api_key else None
        self._client_options = client_options

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serialises it under."""
        return "QragLlamaIndexVectorStore"

    def _options(self) -> dict[str, Any]:
        key = self._api_key.get_secret_value() if self._api_key else None
        return {"url": self.url, "api_key": key, "timeout": self.timeout,
                "retry": RetryPolicy(max_retries=self.max_retries), **self._client_options}

    @property
    def client(self) -> QragClient:
        """The QragClient the store's synchronous calls go through (one connection pool)."""
        if self._client is None:
            self._client = QragClient(**self._options())
        return self._client

    # ---- writes
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Write the nodes as documents (upsert by node id); their ids."""
        if not nodes:
            return []
        receipt = self.client.upsert([_node_document(n) for n in nodes], index=self.index)
        if self.wait:
            self.client.wait_until_searchable(receipt, timeout=self.wait_timeout)
        return [n.node_id for n in nodes]

    async def async_add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """`add`, awaited."""
        if not nodes:
            return []
        async with AsyncQragClient(**self._options()) as client:
            receipt = await client.upsert([_node_document(n) for n in nodes], index=self.index)
            if self.wait:
                await client.wait_until_searchable(receipt, timeout=self.wait_timeout)
        return [n.node_id for n in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the LlamaIndex document `ref_doc_id`."""
        self._delete(filter=_ref_doc_filter([ref_doc_id]))

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """`delete`, awaited."""
        await self._adelete(filter=_ref_doc_filter([ref_doc_id]))

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Delete these nodes, or every node the filters pass (one of the two)."""
        self._delete(**_delete_selector(node_ids, filters))

    async def adelete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                            **delete_kwargs: Any) -> None:
        """`delete_nodes`, awaited."""
        await self._adelete(**_delete_selector(node_ids, filters))

    def _delete(self, **selector: Any) -> None:
        receipt = self.client.delete(index=self.index, **selector)
        if self.wait:
            self.client.wait_until_searchable(receipt, timeout=self.wait_timeout)

    async def _adelete(self, **selector: Any) -> None:
        async with AsyncQragClient(**self._options()) as client:
            receipt = await client.delete(index=self.index, **selector)
            if self.wait:
                await client.wait_until_searchable(receipt, timeout=self.wait_timeout)

    # ---- reads
    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The nodes of these ids (ids the index does not hold are left out), their chunks joined back."""
        if node_ids is None or filters is not None:
            raise NotImplementedError("get_nodes takes node_ids (and no filters): the server reads documents by id")
        found = []
        for node_id in node_ids:
            try:
                doc = self.client.document(node_id, index=self.index)
            except NotFoundError:
                continue
            found.append(_stored_node(node_id, doc.text, doc.metadata))
        return found

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The top `similarity_top_k` chunks for the query's text."""
        return _query_result(self.client.search(**_search_args(query, self.index)))

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """`query`, awaited."""
        async with AsyncQragClient(**self._options()) as client:
            return _query_result(await client.search(**_search_args(query, self.index)))


def _node_document(node: BaseNode) -> Document:
    metadata = dict(node.metadata)
    metadata[REF_DOC_FIELD] = node.ref_doc_id or node.node_id
    return Document(id=node.node_id, text=node.get_content(metadata_mode=MetadataMode.NONE), metadata=metadata)


def _stored_node(node_id: str, text: str, metadata: dict[str, Any]) -> TextNode:
    own = {k: v for k, v in metadata.items() if k != REF_DOC_FIELD}
    ref_doc = metadata.get(REF_DOC_FIELD)
    relationships = {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=ref_doc)} if ref_doc else {}
    return TextNode(id_=node_id, text=text, metadata=own, relationships=relationships)


def _ref_doc_filter(ref_doc_ids: list[str]) -> Filter:
    return {"type": "in", "key": REF_DOC_FIELD, "value": list(ref_doc_ids)}


def _delete_selector(node_ids: list[str] | None, filters: MetadataFilters | None) -> dict[str, Any]:
    if (node_ids is None) == (filters is None):
        raise ValueError("give node_ids or filters (one of the two)")
    return {"ids": list(node_ids)} if node_ids is not None else {"filter": to_qrag_filter(filters)}


def _search_args(query: VectorStoreQuery, index: str | None) -> dict[str, Any]:
    if not query.query_str:
        raise ValueError("a qrag query is its text (the server embeds it): the VectorStoreQuery has no query_str")
    if query.mode not in _SUPPORTED_MODES:
        raise ValueError(f"query mode {VectorStoreQueryMode(query.mode).value!r} is not supported "
                         f"(supported: {', '.join(m.value for m in _SUPPORTED_MODES)})")
    parts = [f for f in (to_qrag_filter(query.filters) if query.filters else None,
                         _ref_doc_filter(query.doc_ids) if query.doc_ids else None) if f is not None]
    search_filter = None if not parts else parts[0] if len(parts) == 1 else {"type": "and", "filters": parts}
    alpha = query.alpha if query.mode == VectorStoreQueryMode.HYBRID else None
    return {"query": query.query_str, "k": query.similarity_top_k, "filter": search_filter,
            "doc_ids": query.node_ids or None, "bm25_alpha": alpha, "index": index}


def _query_result(page: SearchResponse) -> VectorStoreQueryResult:
    nodes = [_result_node(r) for r in page.results]
    return VectorStoreQueryResult(nodes=nodes, similarities=[r.score for r in page.results],
                                  ids=[r.doc_id for r in page.results])


def _result_node(result: SearchResult) -> TextNode:
    return _stored_node(result.doc_id, result.text, result.metadata)
