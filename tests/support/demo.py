"""What a user sees from `qrag demo`: the checks shared by the demo test and the fresh-install test."""

from __future__ import annotations

import re

WITH_Q = "How do I make an object usable in a with statement?"
NO_LLM_TOPICS = "for,while,with,context-managers,try"


def assert_quiet(stderr: str) -> None:
    """Nothing but our own lines: no traceback, no Ray/Ray Data log line, no third-party bar."""
    assert "Traceback" not in stderr
    for line in stderr.splitlines():
        assert not re.match(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d", line), line  # Ray's log formats
        assert "Loading weights" not in line and "Warning" not in line and "(raylet)" not in line, line


def assert_no_llm_demo(stdout: str, stderr: str) -> None:
    """The demo without the LLM on NO_LLM_TOPICS: it says in one line why and how to get the LLM, compares
    what `qrag index` builds by default with the chunk baseline, and the default puts the right topic first
    for every demo question."""
    said = " ".join(stderr.split())  # the console wraps a message at its width
    assert said.count("no LLM (QRAG_NO_LLM=1): generated questions need one, so the demo compares default") == 1
    assert "for the questions, run it without QRAG_NO_LLM." in said, stderr
    assert_quiet(stderr)
    assert "default (no LLM)" in stdout and "chunk (baseline)" in stdout
    assert "(raylet)" not in stdout
    for query in ("When does the else clause of a for loop run?", WITH_Q):
        assert query in stdout
    match = re.search(r"right topic at rank 1: default (\d)/3, chunk (\d)/3", stdout)
    assert match, stdout
    assert int(match.group(1)) == 3, stdout  # the subset holds every answer
