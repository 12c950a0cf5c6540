"""Every test's time as a file of the run (a pytest plugin, loaded by tests/conftest.py).

With QRAG_TEST_DURATIONS=path set (scripts/test.sh sets one per tier, under
${QRAG_TEST_REPORTS:-runs/test-reports}/), the session writes one tab-separated line per test phase
that took 0.01 s or more, slowest first: seconds, phase (setup / call / teardown), outcome, test id.
A session fixture's build shows up in the setup of the first test that asks for it. pytest's own
`--durations` only prints to the terminal, where a 900-line run scrolls it away; this file is what
docs/research/CI-log.md's figures are read from. Under pytest-xdist the controller writes it, from
the reports every worker sends back. Unset: nothing is written.

A test phase of LOUD_S seconds or more is also printed as it ends ("[test phase] 95 s setup tests/..."), so
a run stopped from outside (CI's time limit) still shows where its time went.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "QRAG_TEST_DURATIONS"
MIN_S = 0.01
LOUD_S = 60.0

_rows: list[tuple[float, str, str, str]] = []
_config: list = []


def pytest_configure(config) -> None:
    _config[:] = [config]


def pytest_runtest_logreport(report) -> None:
    if report.duration >= MIN_S:
        _rows.append((report.duration, report.when, report.outcome, report.nodeid))
    reporter = _config[0].pluginmanager.get_plugin("terminalreporter") if _config else None
    if reporter is not None and report.duration >= LOUD_S:
        reporter.ensure_newline()
        reporter.write_line(f"[test phase] {report.duration:.0f} s {report.when} {report.outcome} {report.nodeid}")


def pytest_sessionfinish(session) -> None:
    path = os.environ.get(ENV)
    if not path or hasattr(session.config, "workerinput"):  # an xdist worker: its controller writes
        return
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{s:.2f}\t{when}\t{outcome}\t{nodeid}" for s, when, outcome, nodeid in sorted(_rows, reverse=True)]
    out.write_text("seconds\tphase\toutcome\ttest\n" + "".join(line + "\n" for line in lines), encoding="utf-8")
