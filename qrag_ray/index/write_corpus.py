"""The documents a tenant's writes leave for its next index version (index/compaction.py), as files a
build reads: the writes corpus (`ROOT/writes/corpus/<generation>.jsonl`: every live document whose
latest version came through the API, in the JSONL input schema) and the deleted ids
(`ROOT/writes/corpus/<generation>.deleted`: documents of the batch-built corpus the API deleted, one id a
line). A compaction's build reads its recorded inputs, minus the deleted ids, with the writes corpus
replacing same-id documents (`build.upsert_inputs`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from qrag_ray.index.format import atomic_write_text
from qrag_ray.index.write_delta import record_hash
from qrag_ray.index.write_log import writes_dir
from qrag_ray.io.readers import parse_jsonl_line

CORPUS = "corpus"


def corpus_dir(root: str | Path) -> Path:
    return writes_dir(root) / CORPUS


def corpus_line(record: dict) -> str:
    """One log record as a JSONL input record (what `qrag index --format jsonl` reads)."""
    out = {"id": record["doc_id"], "title": record.get("title") or "", "text": record["text"]}
    if record.get("url"):
        out["url"] = record["url"]
    if record.get("metadata"):
        out["metadata"] = record["metadata"]
    return json.dumps(out, ensure_ascii=False, sort_keys=True)


def write_corpus(path: Path, records: Iterable[dict]) -> int:
    """The records as a JSONL corpus at `path`, sorted by id (written atomically); how many."""
    lines = sorted((r["doc_id"], corpus_line(r)) for r in records)
    atomic_write_text(path, "".join(line + "\n" for _, line in lines))
    return len(lines)


def read_corpus_records(path: Path) -> list[dict]:
    """A writes corpus back as log records ({doc_id, title, text, url, metadata, hash})."""
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        rec = parse_jsonl_line(line, f"{path.name} line {n}", None)
        if rec is None:
            continue
        meta = json.loads(rec["metadata"]) if rec["metadata"] else {}
        out.append({"doc_id": rec["doc_id"], "title": rec["title"], "text": rec["text"], "url": rec["url"],
                    "metadata": meta, "hash": record_hash(rec["doc_id"], rec["title"], rec["text"], rec["url"], meta)})
    return out


def write_ids(path: Path, ids: Iterable[str]) -> int:
    """Document ids one a line (a `--delete-ids` file), sorted, written atomically; how many."""
    ordered = sorted(set(ids))
    atomic_write_text(path, "".join(i + "\n" for i in ordered))
    return len(ordered)


def read_ids(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    return {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
