"""Evaluation-set loaders: SQuAD, BEIR, plain JSONL + qrels (small files written per test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qrag_ray.errors import QragError
from qrag_ray.evaluation.loaders import EvalSet, load_beir, load_eval_set, load_jsonl_qrels, load_squad

SQUAD_DEV = Path("/work/shared/data/squad-v1.1/dev-v1.1.json")


def _squad(tmp_path: Path) -> Path:
    data = {"version": "1.1", "data": [
        {"title": "Alpha", "paragraphs": [
            {"context": "Alpha one.", "qas": [{"id": "q1", "question": "What is alpha one?", "answers": []},
                                              {"id": "q2", "question": "Alpha?", "answers": []}]},
            {"context": "Alpha two.", "qas": [{"id": "q3", "question": "What is alpha two?", "answers": []}]},
        ]},
        {"title": "Beta", "paragraphs": [
            {"context": "Beta one.", "qas": [{"id": "q4", "question": "What is beta?", "answers": []}]},
        ]},
    ]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    return path


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _beir(tmp_path: Path) -> Path:
    root = tmp_path / "scifact"
    (root / "qrels").mkdir(parents=True)
    _jsonl(root / "corpus.jsonl", [{"_id": "d1", "title": "T1", "text": "one"},
                                   {"_id": "d2", "title": "T2", "text": "two"},
                                   {"_id": 3, "title": "", "text": "three"}])
    _jsonl(root / "queries.jsonl", [{"_id": "a", "text": "qa"}, {"_id": "b", "text": "qb"},
                                    {"_id": "c", "text": "qc"}, {"_id": "unjudged", "text": "x"}])
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\na\td1\t2\na\t3\t0\nb\td2\t1\nb\t3\t1\nc\td1\t0\n")
    return root


def test_squad_small(tmp_path):
    eval_set = load_squad(_squad(tmp_path))
    assert isinstance(eval_set, EvalSet)
    assert [d["doc_id"] for d in eval_set.corpus] == ["000-000", "000-001", "001-000"]
    assert [d["title"] for d in eval_set.corpus] == ["Alpha", "Alpha", "Beta"]
    assert [q["qid"] for q in eval_set.queries] == ["q1", "q2", "q3", "q4"]
    assert eval_set.qrels == {"q1": {"000-000": 1}, "q2": {"000-000": 1}, "q3": {"000-001": 1}, "q4": {"001-000": 1}}
    assert eval_set.doc_titles == {"000-000": "Alpha", "000-001": "Alpha", "001-000": "Beta"}
    assert eval_set.gold_titles["q4"] == {"Beta"}
    assert eval_set.stats() == {"documents": 3, "queries": 4, "judgments": 4}


def test_squad_subset_is_prefix_with_all_questions(tmp_path):
    path = _squad(tmp_path)
    eval_set = load_squad(path, subset=2)
    assert [d["doc_id"] for d in eval_set.corpus] == ["000-000", "000-001"]
    assert [q["qid"] for q in eval_set.queries] == ["q1", "q2", "q3"]
    assert load_squad(path, subset=2) == eval_set  # deterministic
    assert len(load_squad(path, subset=100).corpus) == 3


def test_squad_offset_gives_the_next_slice(tmp_path):
    path = _squad(tmp_path)
    held = load_squad(path, subset=1, offset=1)
    assert [d["doc_id"] for d in held.corpus] == ["000-001"]
    assert [q["qid"] for q in held.queries] == ["q3"] and held.qrels == {"q3": {"000-001": 1}}
    assert held.name.endswith("[1:2]")
    rest = load_squad(path, offset=1)
    assert [d["doc_id"] for d in rest.corpus] == ["000-001", "001-000"]
    assert [q["qid"] for q in rest.queries] == ["q3", "q4"]
    with pytest.raises(QragError, match="offset 3 skips all 3 documents"):
        load_squad(path, offset=3)
    with pytest.raises(QragError, match="offset must be a non-negative integer"):
        load_squad(path, offset=-1)


def test_beir_offset(tmp_path):
    root = str(_beir(tmp_path))
    eval_set = load_eval_set("beir", root, subset=1, offset=1)
    assert [d["doc_id"] for d in eval_set.corpus] == ["d2"]
    assert eval_set.queries == []  # query b also needs doc 3, outside the slice
    eval_set = load_eval_set("beir", root, offset=1)
    assert [q["qid"] for q in eval_set.queries] == ["b"] and eval_set.qrels == {"b": {"d2": 1, "3": 1}}
    with pytest.raises(QragError, match="offset 9 skips all 3 documents"):
        load_eval_set("beir", root, offset=9)


def test_write_corpus_jsonl(tmp_path):
    eval_set = load_squad(_squad(tmp_path))
    out = eval_set.write_corpus_jsonl(tmp_path / "out" / "corpus.jsonl")
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0] == {"doc_id": "000-000", "title": "Alpha", "text": "Alpha one."}
    assert len(rows) == 3


@pytest.mark.skipif(not SQUAD_DEV.is_file(), reason="shared SQuAD dev set not present")
def test_squad_full_dev_counts():
    eval_set = load_squad(SQUAD_DEV)
    assert len(eval_set.corpus) == 2067
    assert len(eval_set.queries) == 10570
    assert all(len(r) == 1 for r in eval_set.qrels.values())
    assert len({d["doc_id"] for d in eval_set.corpus}) == 2067
    sub = load_squad(SQUAD_DEV, subset=50)
    assert len(sub.corpus) == 50
    assert [d["doc_id"] for d in sub.corpus] == [d["doc_id"] for d in eval_set.corpus[:50]]
    assert sub.qrels and all(next(iter(r)) in {d["doc_id"] for d in sub.corpus} for r in sub.qrels.values())
    assert len(sub.queries) == sum(1 for r in eval_set.qrels.values() if next(iter(r)) in sub.doc_titles)


BIPAR_VALID = SQUAD_DEV.parent.parent / "bipar-en-valid" / "Monolingual_EN_valid.json"


@pytest.mark.skipif(not BIPAR_VALID.is_file(), reason="shared BiPaR valid set not present")
def test_bipar_valid_counts_and_no_id_titles():
    eval_set = load_eval_set("bipar", BIPAR_VALID)
    assert eval_set.name.startswith("bipar:") and eval_set.stats()["documents"] == 375 and len(eval_set.queries) == 1500
    assert all(d["title"] == "" for d in eval_set.corpus) and not any(eval_set.gold_titles.values())
    sub = load_eval_set("bipar", BIPAR_VALID, subset=10, offset=5)
    assert [d["doc_id"] for d in sub.corpus] == [d["doc_id"] for d in eval_set.corpus[5:15]]
    assert len(sub.queries) == 40  # four questions per passage


def test_bipar_is_squad_format(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"data": [{"title": "lu_ding_ji_1", "paragraphs": [
        {"context": "Wei went north.", "qas": [{"id": "q1", "question": "Who went north?", "answers": []}]}]}]}))
    eval_set = load_eval_set("bipar", path)
    assert eval_set.corpus == [{"doc_id": "000-000", "title": "", "text": "Wei went north."}]
    assert eval_set.qrels == {"q1": {"000-000": 1}}


def test_beir(tmp_path):
    eval_set = load_beir(_beir(tmp_path))
    assert [d["doc_id"] for d in eval_set.corpus] == ["d1", "d2", "3"]  # integer ids become strings
    # 'c' has only a grade-0 judgment and 'unjudged' none: both dropped
    assert [q["qid"] for q in eval_set.queries] == ["a", "b"]
    assert eval_set.qrels == {"a": {"d1": 2, "3": 0}, "b": {"d2": 1, "3": 1}}
    assert eval_set.doc_titles == {"d1": "T1", "d2": "T2", "3": ""}
    assert eval_set.gold_titles == {"a": {"T1"}, "b": {"T2"}}


def test_beir_subset(tmp_path):
    sub = load_beir(_beir(tmp_path), subset=2)
    # 'b' needs doc 3 (outside the first 2 docs): dropped; 'a' keeps only its in-subset judgments
    assert [d["doc_id"] for d in sub.corpus] == ["d1", "d2"]
    assert [q["qid"] for q in sub.queries] == ["a"]
    assert sub.qrels == {"a": {"d1": 2}}


def test_beir_unknown_doc_in_qrels(tmp_path):
    root = _beir(tmp_path)
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\na\td1\t1\na\td3\t1\n")
    with pytest.raises(QragError, match="unknown document 'd3'"):
        load_beir(root)


def test_beir_other_split_missing(tmp_path):
    root = _beir(tmp_path)
    with pytest.raises(QragError, match="split 'dev'"):
        load_beir(root, split="dev")


def _plain(tmp_path: Path, qrels: str) -> Path:
    root = tmp_path / "plain"
    root.mkdir()
    _jsonl(root / "corpus.jsonl", [{"id": "x", "title": "X", "text": "ex"}, {"doc_id": "y", "text": "why"}])
    _jsonl(root / "queries.jsonl", [{"id": "1", "text": "q one"}, {"qid": "2", "text": "q two"}])
    (root / "qrels.tsv").write_text(qrels)
    return root


@pytest.mark.parametrize("qrels", [
    "1\tx\t1\n2\ty\t2\n",                       # tabs, no header
    "qid doc_id grade\n1 x 1\n2   y 2\n",         # spaces, header
    "1 0 x 1\n2 0 y 2\n",                       # TREC 4-column
])
def test_jsonl_qrels_formats(tmp_path, qrels):
    root = _plain(tmp_path, qrels)
    eval_set = load_eval_set("jsonl", str(root))
    assert eval_set.qrels == {"1": {"x": 1}, "2": {"y": 2}}
    assert eval_set.doc_titles == {"x": "X", "y": ""}
    assert eval_set.queries == [{"qid": "1", "text": "q one"}, {"qid": "2", "text": "q two"}]
    es2 = load_jsonl_qrels(root / "corpus.jsonl", root / "queries.jsonl", root / "qrels.tsv", subset=1)
    assert [q["qid"] for q in es2.queries] == ["1"]


def test_dispatch(tmp_path):
    assert len(load_eval_set("squad", str(_squad(tmp_path)), subset=1).corpus) == 1
    assert [q["qid"] for q in load_eval_set("beir", str(_beir(tmp_path)), subset=2).queries] == ["a"]
    with pytest.raises(QragError, match="unknown eval dataset kind 'msmarco'"):
        load_eval_set("msmarco", str(tmp_path))


def test_errors(tmp_path):
    with pytest.raises(QragError, match="SQuAD file not found"):
        load_squad(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(QragError, match="not valid JSON"):
        load_squad(bad)
    bad.write_text('{"version": "1.1"}')
    with pytest.raises(QragError, match="not a SQuAD file"):
        load_squad(bad)
    with pytest.raises(QragError, match="subset"):
        load_squad(_squad(tmp_path), subset=0)

    root = _plain(tmp_path, "1 x 1\n")
    (root / "corpus.jsonl").write_text('{"id": "x", "text": "ok"}\n\n{"id": "y", "text": \n')
    with pytest.raises(QragError, match=r"corpus.jsonl:3: malformed JSON line"):
        load_eval_set("jsonl", str(root))
    (root / "corpus.jsonl").write_text('{"id": "x", "text": "ok"}\n{"text": "no id"}\n')
    with pytest.raises(QragError, match=r"corpus.jsonl:2: missing field"):
        load_eval_set("jsonl", str(root))
    (root / "corpus.jsonl").write_text('{"id": "x", "text": "ok"}\n')
    (root / "qrels.tsv").write_text("1 x 1\n1 zz 1\n")
    with pytest.raises(QragError, match="unknown document 'zz'"):
        load_eval_set("jsonl", str(root))
    (root / "qrels.tsv").write_text("1 x 1\n9 x 1\n")
    with pytest.raises(QragError, match="unknown query '9'"):
        load_eval_set("jsonl", str(root))
    (root / "qrels.tsv").write_text("1 x 1\n1 x high\n")
    with pytest.raises(QragError, match=r"qrels.tsv:2: grade 'high'"):
        load_eval_set("jsonl", str(root))
    (root / "queries.jsonl").unlink()
    with pytest.raises(QragError, match="queries file not found"):
        load_eval_set("jsonl", str(root))
    with pytest.raises(QragError, match="folder not found"):
        load_eval_set("jsonl", str(tmp_path / "nowhere"))
    with pytest.raises(QragError, match="BEIR folder not found"):
        load_eval_set("beir", str(tmp_path / "nowhere"))


def test_error_messages_are_one_line(tmp_path):
    root = _plain(tmp_path, "1 x 1\n")
    (root / "queries.jsonl").write_text("[1, 2]\n")
    with pytest.raises(QragError) as raised:
        load_eval_set("jsonl", str(root))
    assert "\n" not in str(raised.value) and "queries.jsonl:1" in str(raised.value)
