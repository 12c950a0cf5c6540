"""The progress display (qrag_ray.runtime.progress), the log filters (qrag_ray.runtime.logs), QragError's message
surviving Ray's retry annotation, and the demo's comparison table (pure parts)."""

from __future__ import annotations

import io
import logging
import pickle
import re
import time

import pytest
from rich.console import Console

from qrag_ray.errors import IndexFormatError, QragError
from qrag_ray.runtime import logs, progress

# ---------------------------------------------------------------- errors


def test_qrag_error_message_survives_ray_annotation_and_pickling():
    """Ray Data appends its retry advice to args[0] of an exception raised in a map task; the message
    the user sees is the one raised, also after the trip back from the worker (pickle)."""
    error = IndexFormatError("bad.jsonl line 3: malformed JSON line")
    error.args = (error.args[0] + "\nFailed to apply UDF transform after 1/1 attempts ... max_map_retries",)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is IndexFormatError and back.exit_code == 2
    assert str(back) == str(error) == "bad.jsonl line 3: malformed JSON line"
    assert str(QragError()) == ""


# ---------------------------------------------------------------- progress: pure helpers


@pytest.mark.parametrize("name,label", [
    ("ReadText->SplitBlocks(16)->MapBatches(parse)", "ReadText → parse"),
    ("MapBatches(EmbedSink)", "embed"),
    ("MapBatches(base)->MapBatches(EmbedSink)", "embed"),
    ("MapBatches(chunker)", "chunker"),
    ("vLLMEngineStage", "LLM generation (vLLM)"),
    ("Write", "Write"),
])
def test_op_label(name, label):
    assert progress.op_label(name) == label


def test_operator_label_is_what_the_row_shows_whatever_the_function_is_called():
    """Ray Data names a map operator after its function (`MapBatches(<__name__>)`): the UDFs carry their
    label explicitly, so renaming one leaves the display alone, and pickling still finds it by its own name."""
    from qrag_ray.index import udfs

    @progress.operator_label("chunker")
    def chunk_the_documents(batch):
        return batch

    assert chunk_the_documents.__name__ == "chunker"
    assert chunk_the_documents.__qualname__.endswith("chunk_the_documents")
    assert progress.op_label(f"ReadText->MapBatches({chunk_the_documents.__name__})") == "ReadText → chunker"
    assert udfs.attach_atoms.__name__ == "attach_atoms"
    assert pickle.loads(pickle.dumps(udfs.attach_atoms)) is udfs.attach_atoms


def test_rate_and_eta():
    assert progress.rate_and_eta(0, 100, 5.0) == (None, None)
    assert progress.rate_and_eta(50, 100, 10.0) == (5.0, 10.0)
    assert progress.rate_and_eta(50, None, 10.0) == (5.0, None)
    assert progress.rate_and_eta(50, 100, 0.0) == (None, None)


def test_status_line():
    line = progress.status_line("embed", [("embed", 1200, 3400, 20.0), ("Write", 0, None, 20.0)])
    assert line == "… embed: embed 1200/3400 rows, 60.0/s, ETA 37s; Write 0/? rows"
    assert progress.status_line("generate", []) == "… generate: running"


# ---------------------------------------------------------------- progress: the display


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120, color_system=None), buf


def test_display_off_a_terminal_prints_only_finished_stages_and_periodic_status(monkeypatch):
    con, buf = _console(False)
    monkeypatch.setenv("QRAG_PROGRESS_INTERVAL", "0")
    with progress.stage(con, "embed"):
        progress.current().report("ds1", [(1, "MapBatches(EmbedSink)", 10, 40)])
    assert progress.current() is None
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("… embed: embed 10/40 rows")
    assert lines[-1].strip().startswith("✓ embed (")

    con, buf = _console(False)
    with pytest.raises(QragError), progress.stage(con, "read+chunk"):
        raise QragError("bad line")
    assert buf.getvalue() == ""  # a failed stage leaves the error line alone


def test_a_total_the_count_has_passed_is_shown_as_unknown(monkeypatch):
    """An estimate below the rows already done is no total: `?` and no ETA, never `N/N` with rows to come."""
    con, buf = _console(False)
    monkeypatch.setenv("QRAG_PROGRESS_INTERVAL", "0")
    with progress.stage(con, "stream"):
        display = progress.current()
        display.report("ds1", [(1, "MapBatches(EmbedSink)", 10, 40)])
        display.report("ds1", [(1, "MapBatches(EmbedSink)", 50, 40)])
        display.report("ds1", [(1, "MapBatches(EmbedSink)", 60, 90)])
    lines = [line for line in buf.getvalue().splitlines() if line.startswith("…")]
    assert lines[0].startswith("… stream: embed 10/40 rows")
    assert lines[1].startswith("… stream: embed 50/? rows") and "ETA" not in lines[1]
    assert lines[2].startswith("… stream: embed 60/90 rows")


def test_display_on_a_terminal_is_live_and_leaves_one_line_per_stage():
    con, buf = _console(True)
    with progress.stage(con, "generate"):
        display = progress.current()
        assert display.live
        display.report("ds1", [(1, "vLLMEngineStage", 3, 30)])
        (task,) = [t for t in display.progress.tasks if not t.fields.get("stage")]
        assert (task.completed, task.total, task.description.strip()) == (3, 30, "LLM generation (vLLM)")
        display.report("ds1", [(1, "vLLMEngineStage", 30, 30)], finished=True)
        assert [t.fields.get("stage") for t in display.progress.tasks] == [True]  # operator rows gone
        time.sleep(0.3)
    assert not display.progress.live.is_started
    assert "✓ generate (" in buf.getvalue()


def test_no_console_no_display():
    with progress.stage(None, "embed"):
        assert progress.current() is None


@pytest.mark.integration
def test_ray_data_operators_reach_the_display(local_ray, monkeypatch):
    """The ExecutionCallback registered by ensure_ray reports a real Ray Data execution's operators."""
    import ray.data

    dataset = ray.data.range(2000, override_num_blocks=8)
    con, buf = _console(False)
    monkeypatch.setenv("QRAG_PROGRESS_INTERVAL", "0")
    with progress.stage(con, "square"):
        assert dataset.map_batches(lambda b: {"id": b["id"] ** 2}).sum("id") == sum(i * i for i in range(2000))
    out = buf.getvalue()
    assert "… square: " in out and "rows" in out, out
    assert out.splitlines()[-1].strip().startswith("✓ square (")


@pytest.mark.integration
def test_a_build_shows_its_embedding_counting_up_to_its_vectors(local_ray, build_with, corpus_records, jsonl_writer,
                                                                tmp_path, monkeypatch):
    """A real build: the embedding operator is labelled `embed`, it is the one row the stream stage
    shows, it has a total from the start, and its rows count the vectors embedded while the one batch
    is still in the model (counts between 0 and the last), up to all of them."""
    reports = []
    real = progress.Display.report

    def recorded(self, execution, ops, finished=False):  # what the rows show (the last: Ray Data's final count)
        real(self, execution, ops, finished)
        shown = {t.fields["label"]: (int(t.completed), t.total) for t in self.progress.tasks if "label" in t.fields}
        reports.append([(label, *(shown.get(label, (0, None)) if not finished else (done, total)))
                        for label, done, total in ((progress.op_label(o[1]), o[2], o[3]) for o in ops)])

    monkeypatch.setattr(progress.Display, "report", recorded)
    con, buf = _console(False)
    corpus = jsonl_writer(tmp_path / "few.jsonl", corpus_records(with_questions=False)[:8])
    report = build_with({"input": str(corpus), "build.output": str(tmp_path / "idx"),
                         "representation": "chunk+sentence",
                         "chunker.method": "none", "build.embedder.batch_size": 8},
                        console=con)
    rows = [(done, total) for ops in reports for label, done, total in ops if label == "embed"]
    embed = [done for done, _ in rows]
    assert embed and embed == sorted(embed)  # counts up
    # every streamed row is embedded once (the shards then drop exact duplicates)
    assert embed[-1] == report.vectors_embedded + report.vectors_reused >= report.vectors_before_filters > 4
    assert any(0 < done < embed[-1] for done in embed), sorted(set(embed))  # moves inside the one batch
    assert all(total == embed[-1] for done, total in rows if done)  # the total, known once rows move
    assert progress.shown_ops([label for label, *_ in reports[-1]]) == [
        i for i, (label, *_) in enumerate(reports[-1]) if label == "embed"]
    assert "✓ stream (" in buf.getvalue()


@pytest.mark.integration
def test_the_embed_total_is_the_rows_to_come_while_a_multi_block_build_runs(local_ray, build_with, corpus_records,
                                                                           jsonl_writer, tmp_path, monkeypatch):
    """The display read while a build of many blocks runs (files read apart, chunked a document at a
    time, embedded 16 rows a batch): the embed row's total is unknown until chunking has finished, then
    the rows the stage embeds; never below them, so never `N/N` (ETA 0s) while rows are still to come.
    Ray Data's own estimate extrapolates from the blocks so far: it drops, and then trails the count."""
    docs = corpus_records(with_questions=False)
    for i in range(0, len(docs), 2):
        jsonl_writer(tmp_path / "corpus" / f"part{i:02d}.jsonl", docs[i:i + 2])
    monkeypatch.setenv("QRAG_PROGRESS_INTERVAL", "0")  # a status line at every report, 4 a second
    con, buf = _console(False)
    report = build_with({"input": str(tmp_path / "corpus"), "build.output": str(tmp_path / "idx"),
                         "representation": "chunk+sentence", "chunker.method": "none", "build.docs_per_batch": 1,
                         "build.rows_per_part": 16, "build.embedder.batch_size": 8}, console=con)
    final = report.vectors_embedded + report.vectors_reused
    shown = [(int(done), None if total == "?" else int(total), eta) for done, total, eta in
             re.findall(r"\bembed (\d+)/(\d+|\?) rows(?:, [\d.]+/s)?(?:, ETA (\w+))?", buf.getvalue())]
    assert len(shown) >= 5 and final > 8 * 16, (final, buf.getvalue()[-2000:])
    wrong = [(done, total) for done, total, _ in shown if total is not None and total < final]
    assert not wrong, f"embed totals below the {final} rows embedded (N/N while rows were to come): {wrong[:8]}"
    # the total is known before the end, and the ETA comes from it
    during = [(done, eta) for done, total, eta in shown if total == final and 0 < done < final]
    assert during and all(eta for _, eta in during), shown[-10:]


# ---------------------------------------------------------------- logs


def test_native_noise_filter():
    noise = ("[2026-11-25 00:53:13,848 E 5914 5914] core_worker.cc:2465: Actor with class name: "
             "'MapWorker(MapBatches(EmbedSink))' has constructor arguments in the object store")
    assert logs.is_native_noise(noise)
    assert logs.is_native_noise("[2026-11-25 00:56:55,380 I 12086 12086] logging.cc:303: Set ray log level")
    assert not logs.is_native_noise("[2026-11-25 00:56:55,380 F 1 1] raylet.cc:1: Check failed")  # fatal stays
    assert not logs.is_native_noise("error: bad.jsonl line 3: malformed JSON line")


def test_set_verbosity_quiets_libraries_unless_verbose(monkeypatch):
    for variable in logs.QUIET_ENV:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the user's own setting wins
    monkeypatch.setattr(logs, "_level", None)
    logs.set_verbosity(1)
    assert logs.verbosity() == 1 and "HF_HUB_DISABLE_PROGRESS_BARS" not in __import__("os").environ
    logs.set_verbosity(0)
    import os

    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TRANSFORMERS_VERBOSITY"] == "info"
    assert logging.getLogger("sentence_transformers").level == logging.ERROR


def test_quiet_ray_data_mutes_its_console_only(monkeypatch):
    ray_data_logger = logging.getLogger("ray.data")
    console = logging.StreamHandler(io.StringIO())
    file_like = logging.Handler()
    ray_data_logger.addHandler(console)
    ray_data_logger.addHandler(file_like)
    try:
        monkeypatch.setattr(logs, "_level", 0)
        logs.quiet_ray_data()
        rec = logging.LogRecord("ray.data", logging.ERROR, __file__, 1, "boom", None, None)
        assert not console.filter(rec) and file_like.filter(rec)
    finally:
        ray_data_logger.removeHandler(console)
        ray_data_logger.removeHandler(file_like)


# ---------------------------------------------------------------- the demo's table


def _hit(doc, score, *matched):
    return {"doc_id": doc, "score": score, "text": f"{doc} text",
            "matched": [{"kind": k, "text": t, "score": score} for k, t in matched]}


def test_demo_comparison_rows():
    from qrag_ray.cli.demo_cmd import comparison_rows, first_rank, matched_question, won_by

    ours = [_hit("context-managers", 0.81, ("question", "What methods make an object a context manager?"),
                 ("chunk", "…")),
            _hit("try", 0.60, ("chunk", "The try statement specifies handlers"), ("question", "What is try?"))]
    base = [_hit("try", 0.55, ("chunk", "…")), _hit("with", 0.52, ("chunk", "…")), _hit("if", 0.4, ("chunk", "…"))]
    assert matched_question(ours[0]) == "What methods make an object a context manager?"
    assert won_by(ours[1]) == "chunk" and matched_question(base[0]) is None
    expected = ("context-managers", "with")
    assert first_rank(ours, expected) == 1 and first_rank(base, expected) == 2
    assert first_rank(base, ("for",)) is None
    rows = comparison_rows(ours, base, expected)
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert "✓" in rows[0][1] and "matched generated question" in rows[0][1] and "context manager?" in rows[0][1]
    assert "matched its chunk; best question" in rows[1][1]
    assert rows[2][1] == "" and "[bold]if[/] 0.400" in rows[2][2]
    assert "✓" in rows[1][2] and "✓" not in rows[0][2]
