"""A search's results: what `qrag search` prints, `qrag eval` ranks and /v1/search returns (the HTTP
response models are these), built from the merged hits and the page's metadata."""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel, Field

from qrag_ray.search.merge import ChunkResult


class ChunkMeta(NamedTuple):  # a chunk's row of chunks.parquet, as the page needs it
    chunk_id: str
    doc_id: str
    title: str
    text: str
    url: str | None = None
    metadata: dict[str, Any] = {}  # noqa: RUF012 - never mutated: pydantic copies it into each result


# a metadata value as the API returns it (dates as ISO-8601 text)
MetadataValue = bool | int | float | str | list[str]


class Match(BaseModel):
    kind: str = Field(..., description="vector kind that matched: question, chunk, sentence, quote, ...")
    text: str
    score: float


class SearchResult(BaseModel):  # one chunk of a page, exactly as the HTTP API returns it
    chunk_id: str
    doc_id: str
    title: str = ""
    score: float = Field(
        ..., description="the chunk's score under the index's fusion policy (plain: its best vector's cosine)")
    text: str
    matched: list[Match] = Field(default_factory=list, description="the chunk's best-matching vectors, best first")
    bm25: float | None = Field(None, description="hybrid indexes: the chunk's BM25 score over the query's best (0..1)")
    cosine: float | None = Field(None, description="the best raw cosine of the chunk's retrieved vectors to the query")
    url: str | None = Field(None, description="the document's url, when the corpus gave one")
    metadata: dict[str, MetadataValue] = Field(
        default_factory=dict, description="the document's metadata fields ({} when the index has none); dates as "
                                          "ISO-8601 text")

    def to_json(self) -> dict:
        """The CLI's JSON: the HTTP body's fields, without the ones a plain search leaves unset (hybrid
        scores, an absent url, empty metadata): an index without metadata prints what it always did."""
        out = self.model_dump(exclude_none=True)
        if not out["metadata"]:
            del out["metadata"]
        return out


def format_page(results: list[ChunkResult], chunks: dict[int, ChunkMeta],
                matched: dict[tuple[int, int], tuple[str, str]]) -> list[SearchResult]:
    """One query's merged chunks as results; `chunks` and `matched` ((shard, row) -> (kind, text)) hold
    the page's metadata."""
    rnd = lambda x: None if x is None else round(float(x), 6)  # noqa: E731
    # validated construction: pydantic-core builds a result from plain values faster than model_construct
    return [SearchResult(
        **chunks[r.chunk_idx]._asdict(), score=rnd(r.score), bm25=rnd(r.lexical), cosine=rnd(r.cosine),
        matched=[{"kind": matched[(s, row)][0], "text": matched[(s, row)][1], "score": rnd(score)}
                 for s, row, score in r.matches]) for r in results]
