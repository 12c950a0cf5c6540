"""Measured figures against recorded ones: the one regression check of `qrag matrix` and `qrag suite`.

Figures are percent points. More than `tolerance` below the recorded figure is a regression, more than
`tolerance` above is "better than recorded" (update the file). A recorded figure not measured is a
regression (a broken runner must not pass); one recorded as None is "record only", never checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_EPS = 1e-9  # a figure exactly at the tolerance edge passes despite float rounding (0.615 * 100)


def finite_number(value: Any) -> float | None:
    """`v` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class Figure:
    """One recorded figure and what was measured for it."""

    subject: str  # what was measured: a matrix condition, a suite's "dataset / config"
    metric: str
    expected: float | None  # percent; None: record only
    measured: float | None  # percent; None: the runner did not report it
    tolerance: float

    @property
    def delta(self) -> float | None:
        return None if self.measured is None or self.expected is None else self.measured - self.expected

    def __str__(self) -> str:
        where = f"{self.subject}: {self.metric}"
        if self.measured is None:
            return f"{where} not measured (recorded {self.expected:.1f})"
        if self.delta > 0:
            return f"{where} {self.measured:.2f} better than recorded {self.expected:.1f} ({self.delta:+.2f} points)"
        return (f"{where} {self.measured:.2f} vs recorded {self.expected:.1f} "
                f"({self.delta:+.2f} points, tolerance {self.tolerance:g})")


@dataclass
class Comparison:
    regressions: list[Figure] = field(default_factory=list)
    improvements: list[Figure] = field(default_factory=list)
    within: list[Figure] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.regressions

    def lines(self) -> list[str]:
        """One line per regression and per figure better than recorded, as the CLIs print them."""
        return [f"REGRESSION  {r}" for r in self.regressions] + [f"BETTER      {i}" for i in self.improvements]


def compare_figures(figures: Iterable[Figure]) -> Comparison:
    """Sort each recorded figure (not None) into regression, better than recorded or within tolerance."""
    out = Comparison()
    for figure in (f for f in figures if f.expected is not None):
        if figure.measured is None or figure.measured < figure.expected - figure.tolerance - _EPS:
            out.regressions.append(figure)
        elif figure.measured > figure.expected + figure.tolerance + _EPS:
            out.improvements.append(figure)
        else:
            out.within.append(figure)
    return out
