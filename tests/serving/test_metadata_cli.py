"""`qrag search --filter` and `qrag show` on the serving tests' real indexes (delta: documents with metadata;
alpha: none) and on the kinds index (precomputed questions): the same records the HTTP routes return, bad
input as one `error:` line with exit code 2."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from qrag_ray.cli import main
from support.corpus import PYDOC_QUESTIONS, topic_metadata
from support.serving_data import ALPHA_TOPICS

pytestmark = pytest.mark.integration  # real indexes built with Ray and MiniLM


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_search_filter_on_the_cli(tenant_indexes, capsys):
    filter_spec = {"type": "eq", "key": "area", "value": "values"}
    code, out, err = run(["search", "--index", str(tenant_indexes["delta"]), "--k", "50",
                          "--filter", json.dumps(filter_spec), "how are numbers compared?"], capsys)
    assert code == 0, err
    results = json.loads(out)["results"]
    want = {n for i, n in enumerate(ALPHA_TOPICS) if topic_metadata(i, n)["area"] == "values"}
    assert results and {r["doc_id"] for r in results} == want  # every chunk of those documents, no other
    assert all(r["metadata"]["area"] == "values" and r["url"].endswith(f"/{r['doc_id']}.html") for r in results)
    code, out, _ = run(["search", "--index", str(tenant_indexes["alpha"]), "--k", "5", "--doc-id", "for",
                        "--doc-id", "while", "loops"], capsys)
    results = json.loads(out)["results"]
    docs = pq.read_table(tenant_indexes["alpha"] / "chunks.parquet", columns=["doc_id"]).column("doc_id").to_pylist()
    passing = sum(d in ("for", "while") for d in docs)  # k=5, or every chunk of the two when they hold fewer
    assert code == 0 and {r["doc_id"] for r in results} <= {"for", "while"} and len(results) == min(5, passing) > 0
    assert all("metadata" not in r and "url" not in r for r in results)  # an index without metadata prints as before


@pytest.mark.parametrize("index,filter_json,needle", [
    ("delta", '{"type": "eq", "key": "colour", "value": 1}', "unknown metadata field 'colour'; this index has: added"),
    ("delta", '{"type": "lt", "key": "added", "value": "soon"}', "is not an ISO-8601 date"),
    ("delta", '{"type": "eq", "key": "area"', "--filter is not valid JSON"),
    ("alpha", '{"type": "eq", "key": "area", "value": "x"}', "built without document metadata"),
])
def test_bad_filters_are_one_line(tenant_indexes, capsys, index, filter_json, needle):
    code, out, err = run(["search", "--index", str(tenant_indexes[index]), "--filter", filter_json, "loops"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and needle in " ".join(err.split()) and "Traceback" not in err


def test_show_a_chunk_and_a_document(tenant_indexes, kinds_index, capsys):
    code, out, err = run(["show", "--index", str(tenant_indexes["delta"]), "for#0", "--json"], capsys)
    assert code == 0, err
    body = json.loads(out)
    assert (body["chunk_id"], body["doc_id"], body["questions"]) == ("for#0", "for", [])
    assert body["metadata"] == topic_metadata(ALPHA_TOPICS.index("for"), "for") and body["url"].endswith("/for.html")
    code, out, _ = run(["show", "--index", str(tenant_indexes["delta"]), "--doc", "for", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and [c["chunk_id"] for c in doc["chunks"]] == [f"for#{i}" for i in range(len(doc["chunks"]))]
    # the kinds index stores each chunk's precomputed questions (question and quote rows)
    code, out, _ = run(["show", "--index", str(kinds_index[0]), "assert#0", "--json"], capsys)
    assert code == 0 and json.loads(out)["questions"] == PYDOC_QUESTIONS["assert"]
    code, out, _ = run(["show", "--index", str(kinds_index[0]), "assert#0"], capsys)
    assert code == 0 and "? What does the assert statement do?" in out
    for argv, needle in ((["nope#0"], "no chunk 'nope#0'"), (["--doc", "nope"], "no document 'nope'"),
                         ([], "give a chunk id or --doc")):
        code, _, err = run(["show", "--index", str(kinds_index[0]), *argv], capsys)
        assert code == 2 and needle in err
