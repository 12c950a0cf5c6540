"""`qrag index` / `qrag search` contract: the summary, JSON results with k distinct chunks, and bad input
ending in one clear stderr line, a non-zero exit, no traceback and no half index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from qrag_ray.cli import main
from qrag_ray.index.format import shard_faiss


@pytest.mark.integration
def test_index_summary(sentence_cli_index):
    out, code, stderr = sentence_cli_index
    assert code == 0
    assert "index published at" in stderr
    for label in ("documents", "chunks", "questions", "vectors (before filters)", "time: read+chunk",
                  "time: embed", "time: build-shards", "time: total"):
        assert label in stderr, label
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["chunker"] == {"method": "token", "size": 200, "overlap": 20}  # from --config YAML
    assert manifest["representation"] == "atom-sentence" and manifest["num_shards"] == 2
    row = next(line for line in stderr.splitlines() if "│ chunks" in line)
    assert str(manifest["counts"]["chunks"]) in row


@pytest.mark.integration
def test_search_prints_k_distinct_chunks(sentence_cli_index, capsys):
    out = sentence_cli_index[0]
    capsys.readouterr()
    assert main(["search", "--index", str(out), "--k", "7", "When does the else clause of a for loop run?"]) == 0
    res = json.loads(capsys.readouterr().out)
    ids = [r["chunk_id"] for r in res["results"]]
    assert len(ids) == 7 == len(set(ids))
    for result in res["results"]:
        assert {"chunk_id", "doc_id", "score", "text", "matched"} <= set(result)
    assert res["results"][0]["doc_id"] in ("for", "while", "break")


@pytest.mark.integration
def test_search_end_to_end_subprocess(sentence_cli_index):
    """The installed entry point in a fresh process: the contract exactly as a user runs it."""
    out = sentence_cli_index[0]
    process = subprocess.run([sys.executable, "-m", "qrag_ray.cli", "search", "--index", str(out), "--k", "4",
                              "How do I make an object usable in a with statement?"],
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    res = json.loads(process.stdout)["results"]
    assert len({r["chunk_id"] for r in res}) == 4 and res[0]["doc_id"] == "with"


def one_clear_line(capsys, code: int, *needles: str) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert "Traceback" not in "\n".join(lines)
    # the error is one line, the last; anything before it is stage progress ("▶ read+chunk")
    err = lines[-1]
    assert err.startswith("error: "), lines
    assert all(line.lstrip().startswith(("▶", "✓")) for line in lines[:-1]), lines
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture()
def corpus(pydoc_jsonl, tmp_path):
    path = tmp_path / "c.jsonl"
    shutil.copy(pydoc_jsonl, path)
    return path


def no_index_written(tmp_path, out):
    assert not (out / "manifest.json").exists()
    assert not list(tmp_path.glob(f".{out.name}.tmp-*"))


@pytest.mark.parametrize("args,needles", [
    (["--input", "{tmp}/missing.jsonl"], ["input not found", "missing.jsonl"]),
    (["--input", "{corpus}", "--format", "xml"], ["format"]),
    (["--input", "{corpus}", "--representation", "hyde-ish"], ["unknown representation 'hyde-ish'"]),
    (["--input", "{corpus}", "--representation", "hype"], ["needs generated questions"]),
    (["--input", "{corpus}", "--shards", "0"], ["--shards must be at least 1"]),
    (["--input", "{corpus}", "--chunk-size", "10", "--chunk-overlap", "10"], ["overlap"]),
    (["--input", "{corpus}", "--config", "{tmp}/nope.yaml"], ["config file not found"]),
    (["--input", "{corpus}", "--config", "{tmp}/unknown.yaml"], ["chunker.sise", "Extra inputs"]),
    (["--input", "{corpus}", "--config", "{tmp}/notyaml.yaml"], ["not valid YAML"]),
    (["--input", "{corpus}", "--config", "{tmp}/twogroups.yaml"], ["search.groups", "'sentence' is in two groups"]),
    (["--input", "{corpus}", "--config", "{tmp}/bias.yaml"], ["search.kind_bias", "[-2, 2]"]),
    (["--input", "{corpus}", "--config", "{tmp}/flatfusion.yaml"], ["search.fusion", "search.experimental"]),
    (["--input", "{corpus}", "--config", "{tmp}/badknob.yaml"], ["fusoin", "known: fusion"]),
])
def test_bad_flags(args, needles, corpus, tmp_path, capsys):
    (tmp_path / "unknown.yaml").write_text("chunker:\n  sise: 100\n")
    (tmp_path / "notyaml.yaml").write_text("chunker: [unclosed\n")
    (tmp_path / "twogroups.yaml").write_text(
        "search: {experimental: {groups: {a: [sentence], b: [sentence, question]}}}\n")
    (tmp_path / "bias.yaml").write_text("search: {experimental: {kind_bias: {question: 5}}}\n")
    (tmp_path / "flatfusion.yaml").write_text("search: {fusion: rrf}\n")
    (tmp_path / "badknob.yaml").write_text("search: {experimental: {fusoin: rrf}}\n")
    out = tmp_path / "out"
    argv = ["index", "--output", str(out)] + [a.format(tmp=tmp_path, corpus=corpus) for a in args]
    one_clear_line(capsys, main(argv), *needles)
    no_index_written(tmp_path, out)


@pytest.mark.integration
def test_non_empty_output_needs_overwrite(corpus, tmp_path, capsys, sentence_cli_index):
    out = tmp_path / "out"
    shutil.copytree(sentence_cli_index[0], out)
    before = (out / "manifest.json").read_text()
    code = main(["index", "--input", str(corpus), "--output", str(out), "--representation", "chunk"])
    one_clear_line(capsys, code, "is not empty", "--overwrite")
    assert (out / "manifest.json").read_text() == before
    # a folder of someone else's files is never replaced, even with --overwrite
    other = tmp_path / "docs"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    code = main(["index", "--input", str(corpus), "--output", str(other), "--overwrite"])
    one_clear_line(capsys, code, "holds no qrag index")
    assert (other / "notes.txt").read_text() == "mine"


@pytest.mark.integration
def test_empty_and_malformed_corpus(local_ray, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "out"
    one_clear_line(capsys, main(["index", "--input", str(empty), "--output", str(out)]), "empty corpus")
    no_index_written(tmp_path, out)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "fine"}\n{"id": "b", "text": "fine"}\n{"id": "c", "text": \n')
    err = one_clear_line(capsys, main(["index", "--input", str(bad), "--output", str(out)]),
                         "bad.jsonl line 3", "malformed JSON")
    assert err.startswith("error:")
    no_index_written(tmp_path, out)
    notext = tmp_path / "notext.jsonl"
    notext.write_text('{"id": "a", "body": "x"}\n')
    one_clear_line(capsys, main(["index", "--input", str(notext), "--output", str(out)]),
                   "notext.jsonl line 1", "no string field 'text'")


@pytest.mark.integration
def test_search_corrupt_index(sentence_cli_index, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(sentence_cli_index[0], bad)
    path = bad / shard_faiss(1)
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01  # one flipped bit in a shard
    path.write_bytes(bytes(data))
    code = main(["search", "--index", str(bad), "--k", "3", "loops"])
    one_clear_line(capsys, code, "checksum mismatch", "00001.faiss")
    (bad / "manifest.json").write_text("{")
    one_clear_line(capsys, main(["search", "--index", str(bad), "loops"]), "corrupt manifest")
    one_clear_line(capsys, main(["search", "--index", str(tmp_path / "none"), "loops"]), "index not found")
    one_clear_line(capsys, main(["search", "--index", str(sentence_cli_index[0]), "--k", "0", "x"]), "k must be")


@pytest.mark.skipif(os.environ.get("QRAG_SKIP_SUBPROCESS") == "1", reason="subprocess tests disabled")
def test_bad_input_subprocess_exit_code(tmp_path):
    process = subprocess.run([sys.executable, "-m", "qrag_ray.cli", "index", "--input", str(tmp_path / "x.jsonl"),
                              "--output", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert process.returncode == 2 and "Traceback" not in process.stderr
    assert process.stderr.strip().splitlines() == [f"error: input not found: {tmp_path / 'x.jsonl'}"]


@pytest.mark.parametrize("argv,needle", [
    (["eval", "--subset", "3"], "Missing option '--dataset'"),
    (["index", "--bogus"], "No such option: --bogus"),
    (["search", "--index"], "requires an argument"),
])
def test_usage_errors_are_messages_not_tracebacks(argv, needle):
    # typer runs on its vendored click; a usage error from it once escaped main() as a traceback
    process = subprocess.run([sys.executable, "-m", "qrag_ray.cli", *argv], capture_output=True, text=True, timeout=120)
    assert process.returncode == 2, process.stderr
    assert "Traceback" not in process.stderr and needle in process.stderr
