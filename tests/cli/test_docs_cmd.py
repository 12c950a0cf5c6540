"""`qrag docs add/delete/status` (qrag_ray/cli/docs_cmd.py) without a server: the JSONL read as `qrag index`
reads a record, and every mistake in the arguments or the file as one `error:` line and exit code 2 before
anything is sent (a server that cannot be reached is the first thing a correct call meets).
tests/clients/test_client_writes.py runs the commands against a served tenant."""

from __future__ import annotations

import json

import pytest

from qrag_ray.cli import main
from qrag_ray.cli.docs_cmd import read_documents
from qrag_ray.errors import QragError

NOWHERE = "http://127.0.0.1:9"  # nothing listens on the discard port


def write_lines(path, *lines: str):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_read_documents_reads_the_index_input_schema(tmp_path):
    docs_file = write_lines(tmp_path / "docs.jsonl",
                            json.dumps({"id": "a", "text": "Alpha.", "title": "A", "url": "https://x/a",
                                        "metadata": {"lang": "en", "year": 2021, "tags": ["x"], "gone": None}}),
                            "",
                            json.dumps({"doc_id": 7, "contents": "Seven.", "questions": ["q?"], "extra": 1}))
    docs = read_documents(docs_file)
    assert [d.model_dump(mode="json") for d in docs] == [
        {"id": "a", "text": "Alpha.", "title": "A", "url": "https://x/a",
         "metadata": {"lang": "en", "tags": ["x"], "year": 2021}},
        {"id": "7", "text": "Seven.", "title": "", "url": None, "metadata": {}}]


@pytest.mark.parametrize("lines,says", [
    (["{not json"], "docs.jsonl:1: malformed JSON line"),
    ([json.dumps({"id": "a", "text": "x"}), json.dumps({"text": "no id"})], "docs.jsonl:2: record has no id"),
    ([json.dumps({"id": "a"})], "docs.jsonl:1: record 'a' has no string field 'text'"),
    ([json.dumps({"id": "a", "text": "  "})], "docs.jsonl:1: record 'a' has an empty 'text'"),
    ([json.dumps({"id": "a", "text": "x", "metadata": {"n": {"nested": 1}}})], "metadata field 'n'"),
    ([""], "no documents"),
])
def test_read_documents_names_the_line(tmp_path, lines, says):
    with pytest.raises(QragError, match=says):
        read_documents(write_lines(tmp_path / "docs.jsonl", *lines))


@pytest.mark.parametrize("args,says", [
    (["docs", "add", "missing.jsonl"], "missing.jsonl: no such file"),
    (["docs", "add", "docs.jsonl", "--batch-size", "0"], "Invalid value for '--batch-size'"),
    (["docs", "delete"], "give --id ID (repeatable) or --filter JSON: one of the two"),
    (["docs", "delete", "--id", "a", "--filter", "{}"], "one of the two"),
    (["docs", "delete", "--filter", "[1]"], "--filter must be a JSON object"),
    (["docs", "delete", "--filter", "{oops"], "--filter is not valid JSON"),
    (["docs", "status"], "Missing argument 'write_id'"),
    (["docs", "add", "docs.jsonl", "--url", NOWHERE], "cannot reach http://127.0.0.1:9"),
    (["docs", "delete", "--id", "a", "--url", NOWHERE], "cannot reach http://127.0.0.1:9"),
    (["docs", "status", "w-1", "--url", NOWHERE], "cannot reach http://127.0.0.1:9"),
])
def test_each_mistake_is_one_error_line(tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "docs.jsonl", json.dumps({"id": "a", "text": "Alpha."}))
    monkeypatch.setattr("qrag_client.client.time.sleep", lambda seconds: None)  # the connection retries' backoff
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: ") and says in err, err
