"""The benchmarks do not rot: every script answers --help and is in
benchmarks/README.md, nothing in benchmarks/ edits the import path, and the tiny modes that need no LLM, no
GPU and no pod cluster run end to end (one serving script among them, on the session's kinds index) and
write reports whose figures hold what they should. About two minutes for the tiny runs on a quiet 2-core
box (a Ray and Serve start for the serving one, a model load for the embedding one)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def run_script(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m benchmarks.<name> args` from the repository root, without this session's Ray settings (the
    script starts its own Ray with its own layout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)


def report_of(name: str, out: Path, *args: str, timeout: int = 600) -> dict:
    done = run_script(name, "--tiny", "--out", str(out), *args, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"wrote {out}" in done.stdout
    return json.loads(out.read_text())


def test_the_scripts_are_the_readmes():
    readme = (BENCH / "README.md").read_text()
    listed = {name for name in SCRIPTS if f"`{name}`" in readme}
    assert len(SCRIPTS) >= 10 and listed == set(SCRIPTS), f"not in benchmarks/README.md: {set(SCRIPTS) - listed}"


def test_nothing_edits_the_import_path():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in BENCH.rglob("*") if p.is_file() and p.suffix in (".py", ".sh")
             for n, line in enumerate(p.read_text().splitlines(), 1) if "sys.path" in line]
    assert found == []


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_answers_help(name, capsys):
    """Each script imports without its heavy dependencies and parses its options before it starts anything."""
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: ") and "--tiny" in out and "--out" in out


def test_a_bad_baseline_ref_is_a_clear_error(tmp_path):
    done = run_script("shard_memory", "--baseline-ref", "no-such-ref-anywhere", "--index", str(tmp_path), timeout=120)
    assert done.returncode == 2 and "error: --baseline-ref no-such-ref-anywhere: not a commit" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.integration
def test_search_scale_and_bm25_tiny(tmp_path):
    scale = report_of("search_scale", tmp_path / "scale.json", "--work-dir", str(tmp_path / "shards"))
    assert scale["n"] == 20_000 and scale["memory"]["bytes_per_vector"] > 0
    assert [r["k_factor"] for r in scale["search"]] == [1.0, 16.0]
    assert all(0.5 < r["recall@10"] <= 1.0 and r["qps_batch"] > 0 for r in scale["search"])
    bm25 = report_of("bm25", tmp_path / "bm25.json")
    (row,) = bm25["rows"]
    assert row["docs"] == 2000 and row["bm25_query_ms"] > 0 and row["hybrid_over_dense"] > 1


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.soak  # `make bench` runs it (CI runs every script's --help above)
def test_embedding_stage_tiny(tmp_path):
    """The GPU run's script on CPU at a tiny size, passages only (each path loads the model again): the build's
    own Tokenize workers and EmbedSink."""
    report = report_of("embedding", tmp_path / "stage.json", "--mode", "stage", "--device", "cpu", "--questions", "0")
    assert report["workloads"]["passages"]["texts"] == 16 and "questions" not in report["workloads"]
    by_path = {row["path"]: row for row in report["rows"]}
    for path in ("today", "rows64", "ceiling", "forward", "EmbedSink", "stage"):
        assert by_path[path]["texts_per_s"] > 0
    for path in ("EmbedSink", "stage"):  # the parts hold today's vectors exactly on CPU
        assert by_path[path]["max_abs_diff"] == 0.0 and by_path[path]["files_per_batch"] > 0


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.soak  # `make bench` runs it (CI runs every script's --help above)
def test_serving_small_and_shard_memory_tiny(kinds_index, tmp_path):
    """The served app against the in-process engine on the session's index: every page ranked the same."""
    index, _ = kinds_index
    report = report_of("serving_small", tmp_path / "serving.json", "--index", str(index),
                       "--workdir", str(tmp_path / "work"))
    c1 = report["c1"]
    assert c1["new"]["n"] == 8 and c1["new"]["same_ranking"] == 1.0 and c1["in_process"]["p50_ms"] > 0
    assert c1["new"]["handler_p50_ms"]["took_ms"] > 0  # the handler's own account, read from the response
    block = report["blocks"]["4"]
    assert block["new"]["ok"] == 8 and block["new"]["errors"] == 0 and block["new"]["qps"] > 0
    assert block["in_process"]["ok"] == 8
    memory = report_of("shard_memory", tmp_path / "memory.json", "--index", str(index))
    assert [r["shard"] for r in memory["rows"]] == [0, 1, 2]
    assert all(r["resident"] > 0 and r["raw"] > 0 for r in memory["rows"])


def test_a_joins_report_compares_the_new_replicas_requests_with_the_others_in_the_same_seconds():
    """serving_ramp's join report: the box's window before against after, and inside the window after, the
    requests a replica new since the join answered against the rest (named by the responses' replicas)."""
    from benchmarks.harness.ramp_load import join_windows

    def row(sent: float, ms: float, shard: str, router: str = "r1") -> dict:
        return {"t": sent, "stage": 0, "status": 200, "ms": ms, "cold": 0, "replicas": [shard], "router": router}

    before = [row(10 + n * 0.1, 100, "s1") for n in range(50)]
    after = [row(20 + n * 0.2, 100, "s1") for n in range(25)] + [row(20.1 + n * 0.2, 300, "s2") for n in range(25)]
    timeline = [{"t": 19.0, "ShardSearcher0": 1}, {"t": 20.0, "ShardSearcher0": 2}]
    joins = join_windows({"results": before + after, "timeline": timeline, "bounds": [(0.0, 60.0)]})
    assert len(joins) == 1
    join = joins[0]
    assert (join["deployment"], join["from"], join["to"]) == ("ShardSearcher0", 1, 2)
    assert (join["p99_before_ms"], join["p99_after_ms"], join["ratio"]) == (100, 300, 3.0)
    assert (join["new_requests"], join["p99_new_ms"], join["p99_old_ms"], join["new_ratio"]) == (25, 300, 100, 3.0)
