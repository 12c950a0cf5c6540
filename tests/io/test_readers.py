"""Every corpus reader on small files written here, through the real Ray Data reader, plus the pure
record parsers and the HTML text extraction that keeps table cells."""

from __future__ import annotations

import json
import typing

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qrag_ray.config.index import IndexConfig
from qrag_ray.errors import QragError
from qrag_ray.io.html_text import html_to_text
from qrag_ray.io.readers import (
    INPUT_FORMATS,
    normalize_record,
    parse_jsonl_line,
    parse_msmarco_line,
    read_corpus,
    resolve_files,
)


def docs_of(dataset) -> dict[str, dict]:
    rows = dataset.take_all()
    return {r["doc_id"]: {k: (list(v) if k == "questions" else v) for k, v in r.items()} for r in rows}


# ---------------------------------------------------------------- pure parsers


def test_normalize_record_variants():
    assert normalize_record({"id": 7, "text": "x"}, "f") == {"doc_id": "7", "title": "", "text": "x", "url": "",
                                                             "metadata": ""}
    assert normalize_record({"_id": "a", "title": "T", "text": "x"}, "f")["title"] == "T"
    assert normalize_record({"pid": "p1", "contents": "y"}, "f")["text"] == "y"
    record = normalize_record({"id": "a", "text": "x", "questions": "Q1?\n\nQ2?"}, "f", "questions")
    assert record["questions"] == ["Q1?", "Q2?"]
    assert normalize_record({"id": "a", "text": "x"}, "f", "questions")["questions"] == []


@pytest.mark.parametrize("rec,msg", [
    ({"text": "x"}, "no id"),
    ({"id": "", "text": "x"}, "no id"),
    ({"id": "a"}, "no string field 'text'"),
    ({"id": "a", "text": 3}, "no string field 'text'"),
    ({"id": "a", "text": "x", "questions": [1, 2]}, "list of strings"),
    ([1, 2], "expected a JSON object"),
    ({"id": "a", "text": "x", "url": 5}, "'url' must be a string"),
    ({"id": "a", "text": "x", "metadata": "lang=en"}, "'metadata' must be an object"),
    ({"id": "a", "text": "x", "metadata": {"owner": {"team": "x"}}}, "metadata field 'owner': values must be"),
    ({"id": "a", "text": "x", "metadata": {"tags": ["a", 1]}}, "metadata field 'tags': values must be"),
    ({"id": "a", "text": "x", "metadata": {"day": "2024-02-30"}}, "'2024-02-30' is not a valid ISO-8601 date"),
    ({"id": "a", "text": "x", "metadata": {"score": float("nan")}}, "not a finite number"),
    ({"id": "a", "text": "x", "metadata": {"": 1}}, "metadata field name"),
])
def test_normalize_record_errors_name_the_place(rec, msg):
    with pytest.raises(QragError, match=msg) as raised:
        normalize_record(rec, "corpus.jsonl line 3", "questions")
    assert str(raised.value).startswith("corpus.jsonl line 3")


def test_metadata_is_typed_and_travels_as_canonical_json():
    import datetime as dt

    from qrag_ray.io.metadata import field_types, merge_field_types, normalize_metadata, value_type

    meta = {"lang": "en", "year": 2021, "score": 0.5, "public": True, "day": "2024-01-05",
            "at": "2024-01-05T10:00:00+02:00", "tags": ["a", "b"], "gone": None}
    record = normalize_record({"id": "a", "text": "x", "url": "https://x.org/a", "metadata": meta}, "f")
    assert record["url"] == "https://x.org/a"
    assert json.loads(record["metadata"]) == {k: v for k, v in meta.items() if v is not None}
    assert list(json.loads(record["metadata"])) == sorted(json.loads(record["metadata"]))  # canonical: keys sorted
    assert {k: value_type(v) for k, v in json.loads(record["metadata"]).items()} == {
        "lang": "string", "year": "number", "score": "number", "public": "bool", "day": "date", "at": "datetime",
        "tags": "string_list"}
    # Parquet gives dates, timestamps and map columns' key-value pairs
    parquet = normalize_metadata([("d", dt.date(2024, 1, 5)), ("t", dt.datetime(2024, 1, 5, 10))], "f")
    assert parquet == {"d": "2024-01-05", "t": "2024-01-05T10:00:00Z"}
    seen = field_types([("a", {"year": 2021})])
    with pytest.raises(QragError, match="document 'b': metadata field 'year' is a string, but document 'a' has "
                                        "it as a number"):
        field_types([("b", {"year": "2021"})], seen)
    assert merge_field_types([{"y": ["number", "a"]}, {"x": ["bool", "b"], "y": ["number", "c"]}]) == {
        "x": "bool", "y": "number"}
    with pytest.raises(QragError, match="document 'c': metadata field 'y' is a date, but document 'a'"):
        merge_field_types([{"y": ["number", "a"]}, {"y": ["date", "c"]}])


def test_parse_lines():
    assert parse_jsonl_line("   ", "f", None) is None
    with pytest.raises(QragError, match="malformed JSON"):
        parse_jsonl_line('{"id": 1, "text": ', "f", None)
    assert parse_msmarco_line("12\tA passage.\n", "f") == {"doc_id": "12", "title": "", "text": "A passage.",
                                                            "url": "", "metadata": ""}
    with pytest.raises(QragError, match="pid<TAB>passage"):
        parse_msmarco_line("no tab here", "f")


def test_resolve_files(tmp_path):
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("x")
    assert [f.split("/")[-1] for f in resolve_files(str(tmp_path), "jsonl")] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(QragError, match="input not found"):
        resolve_files(str(tmp_path / "missing.jsonl"), "jsonl")
    with pytest.raises(QragError, match="no parquet files"):
        resolve_files(str(tmp_path), "parquet")
    with pytest.raises(QragError, match="no corpus.jsonl"):
        resolve_files(str(tmp_path), "beir")


# ---------------------------------------------------------------- HTML


HTML = """<html><head><title>Planets</title><style>.x{color:red}</style><script>var x=1;</script></head>
<body><nav>Home | About</nav><h1>Inner planets</h1>
<p>The inner planets are rocky.<br>They are close to the Sun.</p>
<table><tr><th>Planet</th><th>Moons</th></tr><tr><td>Earth</td><td>1</td></tr>
<tr><td>Mars</td><td>2</td></tr></table>
<ul><li>Mercury has no moons.</li><li>Venus has none either.</li></ul></body></html>"""


def test_html_keeps_table_cells_and_drops_chrome():
    title, text = html_to_text(HTML)
    assert title == "Planets"
    assert "Planet | Moons" in text and "Earth | 1" in text and "Mars | 2" in text
    assert "They are close to the Sun." in text
    assert "Mercury has no moons." in text.splitlines()
    assert "var x" not in text and "color" not in text and "Home | About" not in text
    assert "Planets" not in text  # the <title> is the title, not body text


def test_html_meta_fields_and_canonical_url():
    from qrag_ray.io.html_text import html_document

    page = ('<html><head><meta charset="utf-8"><meta name="author" content=" Ada "><meta name="author" content="Bob">'
            '<meta property="article:published_time" content="2024-05-01T08:00:00Z">'
            '<link rel="canonical" href="https://x.org/p"></head><body><p>Hi.</p></body></html>')
    title, text, url, meta = html_document(page)
    assert (text, url) == ("Hi.", "https://x.org/p")
    assert meta == {"author": "Ada", "article:published_time": "2024-05-01T08:00:00Z"}  # the first of a repeat
    assert html_document('<meta property="og:url" content="https://x.org/q"><p>x</p>')[2] == "https://x.org/q"


def test_html_title_falls_back_to_h1():
    title, text = html_to_text("<body><h1>Only heading</h1><p>Body.</p></body>")
    assert title == "Only heading" and "Body." in text


# ---------------------------------------------------------------- readers through Ray Data


@pytest.mark.integration
def test_jsonl_reader(local_ray, tmp_path, jsonl_writer):
    path = jsonl_writer(tmp_path / "c.jsonl", [
           {"id": "d1", "title": "One", "text": "First doc.", "questions": ["What is first?"]},
        {"id": 2, "text": "Second doc."},
    ])
    with path.open("a") as file:
        file.write("\n")  # blank lines are skipped
    docs = docs_of(read_corpus(str(path), "jsonl", questions_column="questions"))
    assert docs["d1"] == {"doc_id": "d1", "title": "One", "text": "First doc.", "questions": ["What is first?"],
                          "url": "", "metadata": ""}
    assert docs["2"]["title"] == "" and docs["2"]["questions"] == []
    assert "questions" not in docs_of(read_corpus(str(path), "jsonl"))["d1"]


@pytest.mark.integration
def test_parquet_reader(local_ray, tmp_path):
    path = tmp_path / "c.parquet"
    import datetime as dt

    meta = pa.array([{"lang": "en", "day": dt.date(2024, 1, 5)}, {"lang": None, "day": None}])
    pq.write_table(pa.table({"id": ["a", "b"], "title": ["TA", None], "text": ["Alpha.", "Beta."],
                             "questions": [["Q a?", "Q b?"], []], "url": ["https://x.org/a", None],
                             "metadata": meta}), path)
    docs = docs_of(read_corpus(str(path), "parquet", questions_column="questions"))
    assert docs["a"] == {"doc_id": "a", "title": "TA", "text": "Alpha.", "questions": ["Q a?", "Q b?"],
                         "url": "https://x.org/a", "metadata": '{"day":"2024-01-05","lang":"en"}'}
    assert docs["b"]["title"] == "" and docs["b"]["questions"] == [] and docs["b"]["metadata"] == ""


@pytest.mark.integration
def test_msmarco_reader(local_ray, tmp_path):
    path = tmp_path / "collection.tsv"
    path.write_text("0\tThe presence of communication amid scientific minds.\n1\tManhattan Project.\n")
    docs = docs_of(read_corpus(str(path), "msmarco"))
    none = {"url": "", "metadata": ""}
    assert docs == {"0": {"doc_id": "0", "title": "", "text": "The presence of communication amid scientific minds.",
                          **none}, "1": {"doc_id": "1", "title": "", "text": "Manhattan Project.", **none}}


@pytest.mark.integration
def test_beir_reader(local_ray, tmp_path, jsonl_writer):
    jsonl_writer(tmp_path / "scifact" / "corpus.jsonl", [
        {"_id": "4983", "title": "Microstructural development", "text": "Alterations of the architecture.",
         "metadata": {}},
        {"_id": "5", "title": "T", "text": "Cells.", "metadata": {"url": "https://doi.org/5", "year": 2011}},
    ])
    jsonl_writer(tmp_path / "scifact" / "queries.jsonl", [{"_id": "q1", "text": "not a document"}])
    docs = docs_of(read_corpus(str(tmp_path / "scifact"), "beir"))
    assert docs == {"4983": {"doc_id": "4983", "title": "Microstructural development",
                             "text": "Alterations of the architecture.", "url": "", "metadata": ""},
                    "5": {"doc_id": "5", "title": "T", "text": "Cells.", "url": "",
                          "metadata": '{"url":"https://doi.org/5","year":2011}'}}


@pytest.mark.integration
def test_html_reader(local_ray, tmp_path):
    (tmp_path / "site" / "sub").mkdir(parents=True)
    (tmp_path / "site" / "planets.html").write_text(HTML)
    (tmp_path / "site" / "sub" / "page.htm").write_text("<p>Nested page.</p>")
    docs = docs_of(read_corpus(str(tmp_path / "site"), "html"))
    assert set(docs) == {"planets.html", "sub/page.htm"}
    assert docs["planets.html"]["title"] == "Planets" and "Earth | 1" in docs["planets.html"]["text"]
    assert docs["sub/page.htm"]["title"] == "page"
    assert json.loads(docs["sub/page.htm"]["metadata"]) == {"path": "sub/page.htm"}
    assert docs["sub/page.htm"]["url"] == ""


@pytest.mark.integration
def test_malformed_jsonl_line_is_named(local_ray, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "ok"}) + "\n" + json.dumps({"id": "b", "text": "ok"})
                    + "\n{not json\n")
    with pytest.raises(Exception) as raised:
        read_corpus(str(path), "jsonl").take_all()
    from qrag_ray.errors import find_user_error

    user_error = find_user_error(raised.value)
    assert user_error is not None and "bad.jsonl line 3" in str(user_error) and "malformed JSON" in str(user_error)


def test_unknown_format():
    with pytest.raises(QragError, match="unknown input format 'xml'"):
        read_corpus("x", "xml")


def test_the_config_admits_the_formats_there_are_readers_for():
    assert typing.get_args(IndexConfig.model_fields["format"].annotation) == INPUT_FORMATS
