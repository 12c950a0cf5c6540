"""Evaluation sets: a corpus, queries and graded relevance judgments (qrels), read from SQuAD v1.1 JSON
(SQuAD as retrieval, as QuOTE and HyPE evaluate it), BiPaR, BEIR folders or plain JSONL + TSV qrels.
Loaders are deterministic (file order; `subset` takes a prefix after skipping `offset` documents) and
raise `QragError` with one line on bad input. Ids and titles are strings; grades ints (> 0: relevant).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qrag_ray.errors import QragError
from qrag_ray.evaluation.metrics import gold_titles_from_qrels

EVAL_KINDS = ("squad", "bipar", "beir", "jsonl")


@dataclass
class EvalSet:
    """corpus: [{"doc_id", "title", "text"}] and queries: [{"qid", "text"}] in file order, every query with
    a relevant document; qrels: {qid: {doc_id: grade}} over `corpus` only; doc_titles: {doc_id: title}."""

    name: str
    corpus: list[dict]
    queries: list[dict]
    qrels: dict[str, dict[str, int]]

    @property
    def doc_titles(self) -> dict[str, str]:
        return {d["doc_id"]: d.get("title") or "" for d in self.corpus}

    @property
    def gold_titles(self) -> dict[str, set[str]]:
        """{qid: titles of its relevant documents} (empty titles left out), for title accuracy."""
        return gold_titles_from_qrels(self.qrels, self.doc_titles)

    def stats(self) -> dict[str, int]:
        return {"documents": len(self.corpus), "queries": len(self.queries),
                "judgments": sum(len(r) for r in self.qrels.values())}

    def write_corpus_jsonl(self, path: str | Path) -> Path:
        """Write the corpus as JSONL rows {doc_id, title, text} (the `jsonl` input format of `qrag index`)."""
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        with file.open("w", encoding="utf-8") as stream:
            for document in self.corpus:
                row = {"doc_id": document["doc_id"], "title": document.get("title") or "", "text": document["text"]}
                questions = {"questions": document["questions"]} if "questions" in document else {}
                stream.write(json.dumps(row | questions, ensure_ascii=False) + "\n")
        return file


def check_slice(subset: Any, offset: Any, where: str = "", none: str = "None") -> None:
    """A subset is a positive integer or none (`none` names it: None, or null in YAML), an offset a
    non-negative integer; `where` prefixes the error."""
    if subset is not None and (isinstance(subset, bool) or not isinstance(subset, int) or subset < 1):
        raise QragError(f"{where}subset must be a positive integer or {none}, got {subset!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise QragError(f"{where}offset must be a non-negative integer, got {offset!r}")


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise QragError(f"{what} not found: {path}")
    return path


def _field(obj: dict, names: tuple[str, ...], path: Path, lineno: int) -> Any:
    for name in names:
        if name in obj and obj[name] is not None:
            return obj[name]
    raise QragError(f"{path}:{lineno}: missing field {' or '.join(repr(n) for n in names)}")


def _read_texts(path: Path, id_fields: tuple[str, ...], what: str) -> dict[str, dict]:
    """{id: row} of the non-blank JSONL lines, objects with an id (the first of `id_fields` present) and a
    string `text`; a bad line is a QragError naming it."""
    rows: dict[str, dict] = {}
    with path.open(encoding="utf-8") as stream:
        for lineno, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as error:
                raise QragError(f"{path}:{lineno}: malformed JSON line ({error.msg})") from None
            if not isinstance(obj, dict):
                raise QragError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            rid = str(_field(obj, id_fields, path, lineno))
            if not isinstance(_field(obj, ("text",), path, lineno), str):
                raise QragError(f"{path}:{lineno}: field 'text' must be a string")
            if rid in rows:
                raise QragError(f"{path}:{lineno}: duplicate {what} id {rid!r}")
            rows[rid] = obj
    return rows


def _read_corpus_jsonl(path: Path, id_fields: tuple[str, ...]) -> list[dict]:
    # precomputed questions travel to `qrag index`
    return [{"doc_id": doc_id, "title": "" if obj.get("title") is None else str(obj["title"]), "text": obj["text"]}
            | ({"questions": [str(q) for q in obj["questions"]]} if isinstance(obj.get("questions"), list) else {})
            for doc_id, obj in _read_texts(path, id_fields, "document").items()]


def _read_queries_jsonl(path: Path, id_fields: tuple[str, ...]) -> dict[str, str]:
    return {qid: obj["text"] for qid, obj in _read_texts(path, id_fields, "query").items()}


def _read_qrels_tsv(path: Path) -> dict[str, dict[str, int]]:
    """Qrels lines `qid doc_id grade` (tab or whitespace separated), an optional header line, or TREC
    lines `qid iter doc_id grade`. A repeated (qid, doc_id) keeps the last grade."""
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as stream:
        lines = [(n, s) for n, line in enumerate(stream, 1) if (s := line.strip()) and not s.startswith("#")]
    for i, (lineno, text) in enumerate(lines):
        parts = [x.strip() for x in (text.split("\t") if "\t" in text else text.split())]
        if len(parts) not in (3, 4):  # 4: a TREC line, `qid iter doc_id grade`
            raise QragError(f"{path}:{lineno}: expected 'qid doc_id grade' (3 columns), got {len(parts)} columns")
        qid = parts[0]
        doc_id = parts[-2]
        grade_s = parts[-1]
        try:
            grade = int(float(grade_s))
        except ValueError:
            if i == 0:  # header, e.g. "query-id corpus-id score"
                continue
            raise QragError(f"{path}:{lineno}: grade {grade_s!r} is not a number") from None
        qrels.setdefault(qid, {})[doc_id] = grade
    return qrels


def _assemble(name: str, corpus: list[dict], queries: dict[str, str], qrels: dict[str, dict[str, int]],
              subset: int | None, source: Path, offset: int = 0) -> EvalSet:
    """Check qrels against the full corpus and queries, keep judged queries with a relevant document,
    then apply `offset`/`subset` (N docs after the first `offset`; queries whose relevant docs all lie
    inside). The name gets the slice, e.g. "[300:600]"."""
    if subset or offset:
        name += f"[{offset or ''}:{offset + subset if subset else ''}]"
    doc_ids = {d["doc_id"] for d in corpus}
    for qid, rels in qrels.items():
        if unknown := [d for d in rels if d not in doc_ids]:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise QragError(f"{source}: qrels for query {qid!r} name unknown document {unknown[0]!r}{more}")
        if qid not in queries:
            raise QragError(f"{source}: qrels name unknown query {qid!r}")
    if subset is not None or offset:
        if offset >= len(corpus):
            raise QragError(f"{source}: offset {offset} skips all {len(corpus)} documents")
        corpus = corpus[offset:offset + subset if subset is not None else None]
        doc_ids = {d["doc_id"] for d in corpus}
    kept_qrels = {qid: {d: g for d, g in rels.items() if d in doc_ids} for qid, rels in qrels.items()
                  if (relevant := [d for d, g in rels.items() if g > 0]) and all(d in doc_ids for d in relevant)}
    kept_queries = [{"qid": q, "text": t} for q, t in queries.items() if q in kept_qrels]
    return EvalSet(name=name, corpus=corpus, queries=kept_queries,
                   qrels={q["qid"]: kept_qrels[q["qid"]] for q in kept_queries})


def load_squad(path: str | Path, subset: int | None = None, offset: int = 0) -> EvalSet:
    """SQuAD v1.1 JSON as a retrieval set: every paragraph context is one document, doc_id
    "{article:03d}-{paragraph:03d}" (file order) with the article title as written ("Super_Bowl_50"), and
    every question a query whose only relevant document (grade 1) is its own context."""
    check_slice(subset, offset)
    file = _require_file(Path(path), "SQuAD file")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise QragError(f"{file}: not valid JSON (line {error.lineno}: {error.msg})") from None
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise QragError(f"{file}: not a SQuAD file (no top-level 'data' list)")
    corpus: list[dict] = []
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    paragraphs = ((ai, pi, art, para) for ai, art in enumerate(articles)
                  for pi, para in enumerate(art.get("paragraphs") or []))
    # read up to offset + subset contexts; _assemble drops the first `offset` with their questions
    stop = offset + subset if subset is not None else None
    for article_no, paragraph_no, art, para in itertools.islice(paragraphs, stop):
        if "context" not in para:
            raise QragError(f"{file}: article {article_no} paragraph {paragraph_no} has no 'context'")
        doc_id = f"{article_no:03d}-{paragraph_no:03d}"
        corpus.append({"doc_id": doc_id, "title": str(art.get("title") or ""), "text": para["context"]})
        for question_no, entry in enumerate(para.get("qas") or []):
            qid = str(entry.get("id") or f"{doc_id}-q{question_no:03d}")
            if "question" not in entry:
                raise QragError(f"{file}: question {qid!r} has no 'question' text")
            if qid in qrels:
                raise QragError(f"{file}: duplicate question id {qid!r}")
            queries[qid] = entry["question"]
            qrels[qid] = {doc_id: 1}
    return _assemble(f"squad:{file.stem}", corpus, queries, qrels, subset, file, offset)


def load_bipar(path: str | Path, subset: int | None = None, offset: int = 0) -> EvalSet:
    """BiPaR monolingual English (novel passages in SQuAD v1.1 format). Its "titles" are file ids
    ("lu_ding_ji_753"), not words a reader would search with, so they are dropped."""
    eval_set = load_squad(path, subset, offset)
    return replace(eval_set, name=eval_set.name.replace("squad:", "bipar:", 1),
                   corpus=[d | {"title": ""} for d in eval_set.corpus])


def load_beir(folder: str | Path, split: str = "test", subset: int | None = None, offset: int = 0) -> EvalSet:
    """A BEIR dataset folder: corpus.jsonl (`_id`, `title`, `text`), queries.jsonl (`_id`, `text`) and
    qrels/{split}.tsv (header `query-id corpus-id score`, graded). Only queries judged in the split with a
    relevant document are kept; with `subset`, their judgments of documents outside it are dropped."""
    check_slice(subset, offset)
    root = Path(folder)
    if not root.is_dir():
        raise QragError(f"BEIR folder not found: {root}")
    corpus = _read_corpus_jsonl(_require_file(root / "corpus.jsonl", "BEIR corpus"), ("_id", "id", "doc_id"))
    queries = _read_queries_jsonl(_require_file(root / "queries.jsonl", "BEIR queries"), ("_id", "id", "qid"))
    qrels_p = _require_file(root / "qrels" / f"{split}.tsv", f"BEIR qrels for split '{split}'")
    return _assemble(f"beir:{root.name}/{split}", corpus, queries, _read_qrels_tsv(qrels_p), subset, qrels_p, offset)


def load_jsonl_qrels(corpus_jsonl: str | Path, queries_jsonl: str | Path, qrels_tsv: str | Path,
                     subset: int | None = None, offset: int = 0) -> EvalSet:
    """Plain files: corpus JSONL (`id` or `doc_id`, optional `title`, `text`), queries JSONL (`id` or `qid`,
    `text`) and a qrels TSV (`qid doc_id grade` or TREC `qid 0 doc_id grade`, tabs or spaces, header or not).
    Only judged queries with a relevant document are kept."""
    check_slice(subset, offset)
    corpus_file = _require_file(Path(corpus_jsonl), "corpus file")
    queries_file = _require_file(Path(queries_jsonl), "queries file")
    qrels_file = _require_file(Path(qrels_tsv), "qrels file")
    return _assemble(f"jsonl:{corpus_file.parent.name or corpus_file.stem}",
                     _read_corpus_jsonl(corpus_file, ("doc_id", "id", "_id")),
                     _read_queries_jsonl(queries_file, ("qid", "id", "_id")), _read_qrels_tsv(qrels_file), subset,
                     qrels_file, offset)


def load_eval_set(kind: str, data: str | Path, subset: int | None = None, split: str = "test",
                  offset: int = 0) -> EvalSet:
    """Dispatch on kind: "squad" or "bipar" (data = the JSON file), "beir" (data = the dataset folder; `split`
    picks qrels/{split}.tsv), "jsonl" (data = a folder holding corpus.jsonl, queries.jsonl, qrels.tsv)."""
    if kind in ("squad", "bipar"):
        return (load_squad if kind == "squad" else load_bipar)(data, subset, offset)
    if kind == "beir":
        return load_beir(data, split=split, subset=subset, offset=offset)
    if kind == "jsonl":
        root = Path(data)
        if not root.is_dir():
            raise QragError(f"jsonl eval folder not found: {root} (expected corpus.jsonl, queries.jsonl, qrels.tsv)")
        return load_jsonl_qrels(root / "corpus.jsonl", root / "queries.jsonl", root / "qrels.tsv", subset, offset)
    raise QragError(f"unknown eval dataset kind {kind!r} (known: {', '.join(EVAL_KINDS)})")
