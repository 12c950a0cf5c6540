"""A search's results: what `qrag search` prints, `qrag eval` ranks and /v1/search returns (the HTTP
response models are these), built from the merged hits and the page's metadata; and a document as the
fetch routes return it."""

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
    metadata: dict[str, Any] = {}


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
    vector: list[float] | None = Field(
        None, description="with include_vectors: the stored vector of the chunk's best-matching row (L2-normalised; "
                          "None where the index keeps no full vectors, e.g. IVF-PQ)")
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


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def format_page(results: list[ChunkResult], chunks: dict[int, ChunkMeta],
                row_texts: dict[tuple[int, int], tuple[str, str]],
                row_vectors: dict[tuple[int, int], list[float] | None] | None = None) -> list[SearchResult]:
    """One query's merged chunks as results; `chunks` (chunk_idx -> record) and `row_texts` ((shard, row) ->
    (kind, text)) hold the page's metadata, `row_vectors` (when asked for) the best rows' stored vectors."""
    # validated construction: pydantic-core builds a result from plain values faster than model_construct
    return [SearchResult(
        **chunks[result.chunk_idx]._asdict(), score=_rounded(result.score), bm25=_rounded(result.lexical),
        cosine=_rounded(result.cosine),
        vector=None if row_vectors is None or not result.matches else row_vectors.get(result.matches[0][:2]),
        matched=[{"kind": row_texts[(shard, row)][0], "text": row_texts[(shard, row)][1], "score": _rounded(score)}
                 for shard, row, score in result.matches]) for result in results]


def _chunk_number(record: dict) -> int:
    """A chunk's number in its document (`doc#n`), -1 when its id has none."""
    tail = record["chunk_id"].rsplit("#", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def document_body(doc_id: str, records: list[dict]) -> dict:
    """A document as the fetch route returns it (without `index`, `index_version`) from its chunks' records,
    whichever shards they came from: its url, metadata and its chunks in document order."""
    chunks = sorted(records, key=_chunk_number)
    first = chunks[0]
    return {"doc_id": doc_id, "title": first["title"], "url": first["url"], "metadata": first["metadata"],
            "chunks": [{name: chunk[name] for name in ("chunk_id", "title", "text", "questions")} for chunk in chunks]}
