"""A LlamaIndex retriever over a qrag server (`qrag-client[llamaindex]`): `retrieve` / `aretrieve` return
NodeWithScore, one TextNode per chunk (id = chunk id, text, metadata as SearchResult.flat_metadata, the
document as its SOURCE), ranked as /v1/search ranks them.

LlamaIndex's MetadataFilters map onto the search filter: operators ==, !=, >, >=, <, <=, in, nin and the
conditions and/or, nested. Others (not, any, all, contains, text_match, is_empty) have no counterpart
in the search filter and are refused with UnsupportedFilterError when the retriever is made."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import NodeRelationship, NodeWithScore, QueryBundle, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from qrag_client.client import DEFAULT_URL, AsyncQragClient, QragClient, RetryPolicy
from qrag_client.models import Filter, SearchResponse

_OPERATORS = {FilterOperator.EQ: "eq", FilterOperator.NE: "ne", FilterOperator.GT: "gt", FilterOperator.GTE: "gte",
              FilterOperator.LT: "lt", FilterOperator.LTE: "lte", FilterOperator.IN: "in", FilterOperator.NIN: "nin"}
_CONDITIONS = {FilterCondition.AND: "and", FilterCondition.OR: "or"}
# what an LLM or an embedding sees of a node: its title and source, not our scores and bookkeeping
_NOT_FOR_MODELS = ["chunk_id", "score", "cosine", "bm25", "matched_question", "matched_kind", "matched_text", "index",
                   "index_version", "metadata"]


class UnsupportedFilterError(ValueError):
    """A MetadataFilters operator or condition the search filter cannot express."""


def to_qrag_filter(filters: MetadataFilters | MetadataFilter) -> Filter | None:
    """LlamaIndex filters as the search filter (None for an empty MetadataFilters)."""
    if isinstance(filters, MetadataFilter):
        op = _OPERATORS.get(FilterOperator(filters.operator))
        if op is None:
            raise UnsupportedFilterError(
                f"filter operator {FilterOperator(filters.operator).value!r} on {filters.key!r} is not supported by "
                f"qrag's search filter (supported: {', '.join(o.value for o in _OPERATORS)})")
        if (op in ("in", "nin")) != isinstance(filters.value, list):
            raise UnsupportedFilterError(f"filter on {filters.key!r}: {FilterOperator(filters.operator).value!r} "
                                         + ("takes a list of values" if op in ("in", "nin") else "takes one value"))
        return {"type": op, "key": filters.key, "value": filters.value}
    cond = _CONDITIONS.get(FilterCondition(filters.condition or FilterCondition.AND))
    if cond is None:
        raise UnsupportedFilterError(f"filter condition {FilterCondition(filters.condition).value!r} is not "
                                     "supported by qrag's search filter (supported: and, or)")
    parts = [p for p in (to_qrag_filter(f) for f in filters.filters) if p is not None]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return {"type": cond, "filters": parts}


def to_nodes(page: SearchResponse) -> list[NodeWithScore]:
    out = []
    for r in page.results:
        node = TextNode(id_=r.chunk_id, text=r.text, metadata=r.flat_metadata(page.index, page.index_version),
                        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=r.doc_id)},
                        excluded_llm_metadata_keys=list(_NOT_FOR_MODELS),
                        excluded_embed_metadata_keys=list(_NOT_FOR_MODELS))
        out.append(NodeWithScore(node=node, score=r.score))
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
        self.doc_ids, self.index = doc_ids, index
        self._options: dict[str, Any] = {"url": url, "api_key": api_key, "timeout": timeout,
                                         "retry": RetryPolicy(max_retries=max_retries)}
        self._client: QragClient | None = None

    def _search_args(self) -> dict[str, Any]:
        return {"k": self.similarity_top_k, "filter": self.filter, "doc_ids": self.doc_ids, "index": self.index}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._client is None:
            self._client = QragClient(**self._options)
        return to_nodes(self._client.search(query_bundle.query_str, **self._search_args()))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        async with AsyncQragClient(**self._options) as c:  # an AsyncClient belongs to the loop it was made on
            return to_nodes(await c.search(query_bundle.query_str, **self._search_args()))
