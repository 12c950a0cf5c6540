"""Chunkers: documents -> chunks (pure functions). The token window counts whitespace-delimited tokens and
cuts at character offsets, so a chunk keeps the document's spacing and is always a substring of it (a
user can check a citation); paragraph and sentence chunking follow natural units."""

from __future__ import annotations

import re
from typing import Iterator

from qrag_ray.config.index import ChunkerConfig
from qrag_ray.text.sentences import split_sentences

_TOKEN = re.compile(r"\S+")
_PARA = re.compile(r"\n\s*\n")


def token_windows(text: str, size: int, overlap: int) -> list[str]:
    """Windows of `size` tokens, each sharing `overlap` with the next; the last one reaches the end."""
    spans = [m.span() for m in _TOKEN.finditer(text)]
    if not spans:
        return []
    if overlap >= size:
        raise ValueError("overlap must be smaller than size")
    starts = range(0, max(len(spans) - overlap, 1), size - overlap)
    return [text[spans[s][0]:spans[min(s + size, len(spans)) - 1][1]] for s in starts]


def paragraphs(text: str, max_tokens: int | None = None, overlap: int = 0) -> list[str]:
    """Blank-line separated paragraphs; a paragraph longer than max_tokens is windowed."""
    out = []
    for paragraph in filter(None, (p.strip() for p in _PARA.split(text or ""))):
        long = max_tokens and len(_TOKEN.findall(paragraph)) > max_tokens
        out.extend(token_windows(paragraph, max_tokens, min(overlap, max_tokens - 1)) if long else [paragraph])
    return out


def sentence_groups(text: str, max_sentences: int) -> list[str]:
    """Consecutive groups of up to max_sentences sentences."""
    sents = split_sentences(text)
    return [" ".join(sents[i:i + max_sentences]) for i in range(0, len(sents), max_sentences)]


def chunk_text(text: str, cfg: ChunkerConfig) -> list[str]:
    text = text or ""
    if cfg.method == "none":
        return [text.strip()] if text.strip() else []
    if cfg.method == "token":
        return token_windows(text, cfg.size, cfg.overlap)
    if cfg.method == "paragraph":
        return paragraphs(text, max_tokens=cfg.size, overlap=cfg.overlap)
    return sentence_groups(text, cfg.size)  # "sentence": the config admits no other method


def chunk_document(doc: dict, cfg: ChunkerConfig) -> Iterator[dict]:
    """Chunk rows for one normalized document; chunk_id = '{doc_id}#{n}'."""
    for number, piece in enumerate(chunk_text(doc["text"], cfg)):
        yield {"chunk_id": f"{doc['doc_id']}#{number}", "doc_id": doc["doc_id"], "title": doc.get("title") or "",
               "text": piece}
