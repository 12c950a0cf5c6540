"""The one regression check behind `qrag matrix` and `qrag suite`: recorded figures vs measured ones."""

from __future__ import annotations

import pytest

from qrag_ray.evaluation.regression import Figure, compare_figures


def _fig(measured, expected=60.0, tolerance=1.0, subject="squad / chunk"):
    return Figure(subject, "nDCG@10", expected, measured, tolerance)


@pytest.mark.parametrize("measured,verdict", [
    (58.9, "regression"), (59.0, "within"), (60.0, "within"), (61.0, "within"), (61.1, "better"),
    (None, "regression"),  # recorded but not measured: a broken runner must not pass
])
def test_each_figure_lands_in_one_verdict(measured, verdict):
    res = compare_figures([_fig(measured)])
    got = {"regression": res.regressions, "within": res.within, "better": res.improvements}
    assert [v for v, figs in got.items() if figs] == [verdict]
    assert res.passed == (verdict != "regression")


def test_the_tolerance_edge_passes_despite_float_rounding():
    assert compare_figures([_fig(0.615 * 100, expected=62.5, tolerance=1.0)]).passed


def test_a_figure_recorded_as_none_is_never_checked():
    res = compare_figures([_fig(10.0, expected=None), _fig(None, expected=None)])
    assert res.passed and not res.within and not res.improvements


def test_lines_say_what_moved_and_by_how_much():
    res = compare_figures([_fig(57.5), _fig(None, subject="fiqa / bm25"), _fig(63.0, subject="squad / mix")])
    assert [f.subject for f in res.regressions] == ["squad / chunk", "fiqa / bm25"]
    assert res.regressions[0].delta == pytest.approx(-2.5)
    assert res.lines() == [
        "REGRESSION  squad / chunk: nDCG@10 57.50 vs recorded 60.0 (-2.50 points, tolerance 1)",
        "REGRESSION  fiqa / bm25: nDCG@10 not measured (recorded 60.0)",
        "BETTER      squad / mix: nDCG@10 63.00 better than recorded 60.0 (+3.00 points)",
    ]
