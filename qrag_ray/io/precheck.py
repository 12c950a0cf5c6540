"""Check a small local corpus on the driver before Ray starts: a bad record found in a Ray Data task reaches
the user only after Ray started, through its exception wrappers. A corpus parsed in about a second
(`QRAG_PRECHECK_MAX_BYTES`, 64 MB by default) is parsed here first with the readers' own functions: the
same line, with file and line number, at once (a metadata field whose type disagrees with an earlier
document's too). Larger or remote corpora are checked by the readers and the build."""

from __future__ import annotations

import gzip
import json
import os

from qrag_ray.errors import QragError

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def precheck_corpus(path: str, fmt: str, files: list[str], questions_column: str | None = None) -> None:
    """Parse every record of small local text `files`: QragError for a bad record, a repeated id or none."""
    from qrag_ray.io.metadata import field_types
    from qrag_ray.io.readers import parse_jsonl_line, parse_msmarco_line

    try:
        limit = int(os.environ.get("QRAG_PRECHECK_MAX_BYTES", DEFAULT_MAX_BYTES))
    except ValueError:
        limit = DEFAULT_MAX_BYTES
    local_text = fmt in ("jsonl", "beir", "msmarco") and not any("://" in f for f in files)
    try:
        if not local_text or sum(os.path.getsize(f) for f in files) > limit:
            return
    except OSError:
        return
    seen: dict[str, str] = {}
    types: dict[str, list] = {}
    for file in files:
        name = os.path.basename(file)
        try:
            with (gzip.open if file.endswith(".gz") else open)(file, "rt", encoding="utf-8", errors="strict") as stream:
                for line_number, line in enumerate(stream, 1):
                    where = f"{name} line {line_number}"
                    line = line.rstrip("\r\n")
                    rec = (parse_msmarco_line(line, where) if fmt == "msmarco"
                           else parse_jsonl_line(line, where, questions_column))
                    if rec is not None and (first := seen.setdefault(rec["doc_id"], where)) != where:
                        raise QragError(f"{where}: duplicate document id {rec['doc_id']!r} (first at {first}); "
                                        "document ids must be unique")
                    if rec is not None and rec["metadata"]:
                        try:
                            field_types([(rec["doc_id"], json.loads(rec["metadata"]))], types)
                        except QragError as error:
                            raise QragError(f"{where}: {error}") from None
        except UnicodeDecodeError as error:
            raise QragError(f"{name}: not UTF-8 text ({error.reason} at byte {error.start})") from None
        except (OSError, EOFError) as error:
            raise QragError(f"cannot read {file}: {error.strerror or error}") from None
    if not seen:
        raise QragError(f"empty corpus: no documents in {path}")
