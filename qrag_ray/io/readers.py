"""Corpus readers: every input format becomes a Ray Dataset of {doc_id, title, text, url, metadata[,
questions]}. One pure function parses a record (normalize_record), so bad input reads the same whatever
the reader. `metadata` is the document's fields as canonical JSON ("" for none, qrag_ray.index.metadata),
`url` "" when the record has none."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from qrag_ray.errors import QragError
from qrag_ray.io.metadata import normalize_metadata, to_json
from qrag_ray.runtime.progress import operator_label

INPUT_FORMATS = ("jsonl", "parquet", "msmarco", "beir", "html")  # IndexConfig.format lists the same
_ID_KEYS = ("doc_id", "id", "_id", "pid", "docid")
_SUFFIXES = {"jsonl": (".jsonl", ".json", ".jsonl.gz"), "parquet": (".parquet",), "msmarco": (".tsv",),
             "html": (".html", ".htm")}


def normalize_record(rec: dict[str, Any], where: str, questions_column: str | None = None) -> dict:
    """One raw record -> {doc_id, title, text, url, metadata[, questions]}. Raises QragError naming `where`."""
    if not isinstance(rec, dict):
        raise QragError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    doc_id = next((rec[k] for k in _ID_KEYS if rec.get(k) is not None), None)
    if doc_id is None or str(doc_id).strip() == "":
        raise QragError(f"{where}: record has no id (one of {', '.join(_ID_KEYS)})")
    text = rec.get("text", rec.get("contents"))
    if not isinstance(text, str):
        raise QragError(f"{where}: record {doc_id!r} has no string field 'text'")
    url = rec.get("url")
    if url is not None and not isinstance(url, str):
        raise QragError(f"{where}: record {doc_id!r}: 'url' must be a string")
    meta = normalize_metadata(rec.get("metadata"), f"{where}: record {doc_id!r}")
    out = {"doc_id": str(doc_id), "title": str(rec.get("title") or ""), "text": text, "url": url or "",
           "metadata": to_json(meta)}
    if questions_column:
        questions = rec.get(questions_column)
        if isinstance(questions, str):
            questions = [q for q in questions.split("\n") if q.strip()]
        if questions is not None and not (isinstance(questions, list) and all(isinstance(q, str) for q in questions)):
            raise QragError(f"{where}: record {doc_id!r}: '{questions_column}' must be a list of strings")
        out["questions"] = questions or []
    return out


def parse_jsonl_line(line: str, where: str, questions_column: str | None) -> dict | None:
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as error:
        raise QragError(f"{where}: malformed JSON line ({error.msg}): {line[:80]!r}") from None
    return normalize_record(rec, where, questions_column)


def parse_msmarco_line(line: str, where: str) -> dict | None:
    if not line.strip():
        return None
    pid, sep, text = line.partition("\t")
    if not sep or not pid.strip():
        raise QragError(f"{where}: expected 'pid<TAB>passage', got {line[:80]!r}")
    return {"doc_id": pid.strip(), "title": "", "text": text.strip(), "url": "", "metadata": ""}


def resolve_files(path: str, fmt: str) -> list[str]:
    """Input files for a path (file, folder or glob); a clear error when there are none."""
    if "://" in path:
        return [path]
    location = Path(path)
    if fmt == "beir":
        corpus = location / "corpus.jsonl" if location.is_dir() else location
        if not corpus.is_file():
            raise QragError(f"BEIR folder {path} has no corpus.jsonl")
        return [str(corpus)]
    if any(ch in path for ch in "*?["):
        files = sorted(glob.glob(path, recursive=True))
    elif location.is_dir():
        files = sorted(str(f) for f in location.rglob("*") if f.is_file() and f.name.endswith(_SUFFIXES[fmt]))
    elif location.is_file():
        files = [str(location)]
    else:
        raise QragError(f"input not found: {path}")
    if not files:
        raise QragError(f"no {fmt} files ({', '.join(_SUFFIXES[fmt])}) under {path}")
    return files


def read_corpus(path: str, fmt: str, questions_column: str | None = None):
    """A Ray Dataset of normalized documents. Lazy: errors in records surface when it executes."""
    import ray.data

    if fmt not in INPUT_FORMATS:
        raise QragError(f"unknown input format '{fmt}' (known: {', '.join(INPUT_FORMATS)})")
    files = resolve_files(path, fmt)
    if fmt in ("jsonl", "beir", "msmarco"):
        @operator_label("parse")
        def parse(batch: dict) -> dict:
            rows = []
            for line, src in zip(batch["text"], batch["path"], strict=True):
                where = os.path.basename(src)
                try:
                    rec = (parse_msmarco_line(line, where) if fmt == "msmarco"
                           else parse_jsonl_line(line, where, questions_column))
                except QragError as error:
                    # read_text does not number lines; find the bad one only on this error path
                    raise QragError(str(error).replace(where, f"{where} line {_line_number(src, line)}", 1)) from None
                if rec is not None:
                    rows.append(rec)
            return _columns(rows, questions_column)

        return ray.data.read_text(files, include_paths=True).map_batches(parse, batch_format="numpy", batch_size=4096)

    if fmt == "parquet":
        @operator_label("norm")
        def norm(batch) -> dict:
            return _columns([normalize_record(r, "parquet", questions_column) for r in batch.to_pylist()],
                            questions_column)

        return ray.data.read_parquet(files).map_batches(norm, batch_format="pyarrow", batch_size=4096)

    root = path if Path(path).is_dir() else str(Path(path).parent)

    @operator_label("extract")
    def extract(batch: dict) -> dict:  # html
        from qrag_ray.io.html_text import html_document

        rows = []
        for data, src in zip(batch["bytes"], batch["path"], strict=True):
            rel = src if "://" in src else os.path.relpath(src, root)
            title, text, url, meta = html_document(bytes(data))
            meta = normalize_metadata({**meta, "path": rel}, f"{rel}: <meta>")
            rows.append({"doc_id": rel, "title": title or Path(src).stem, "text": text,
                         "url": src if "://" in src else url, "metadata": to_json(meta)})
        return _columns(rows, None)

    dataset = ray.data.read_binary_files(files, include_paths=True)
    return dataset.map_batches(extract, batch_format="numpy", batch_size=64)


def _line_number(path: str, line: str) -> str:
    """1-based number of the first line of `path` equal to `line` ('?' when it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return next((str(n) for n, got in enumerate(file, 1) if got.rstrip("\r\n") == line.rstrip("\r\n")), "?")
    except OSError:
        return "?"


def _columns(rows: list[dict], questions_column: str | None) -> dict:
    out = {k: np.array([r[k] for r in rows], dtype=object) for k in ("doc_id", "title", "text", "url", "metadata")}
    if questions_column:  # one list per row (np.array would make a 2-D array of equal-length lists)
        out["questions"] = np.fromiter((list(r.get("questions", [])) for r in rows), dtype=object, count=len(rows))
    return out
