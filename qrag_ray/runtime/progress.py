"""One progress display for long work: a row per pipeline stage and under it a row per running Ray Data
operator (rows done, total, rate, ETA), fed by qrag_ray.runtime.progress_ray (Ray Data's own bars stay off). A
terminal gets a rich live view leaving one "✓ stage (time)" line per stage; elsewhere a status line every
`QRAG_PROGRESS_INTERVAL` seconds (default 30), so a command that fails early prints only its error.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

_WRAPPER = re.compile(r"\b(?:MapBatches|Map|FlatMap|Filter|MapRows)\((.*?)\)")

# operators named for what they do (the embedding sink's output rows are the vectors it has done)
_NAMED_OPS = {"EmbedSink": "embed", "Tokenize": "tokenize", "vLLMEngineStage": "LLM generation (vLLM)"}
# operators with one output row per input row: their total is their input's, once that is certain
ONE_TO_ONE = ("EmbedSink", "Tokenize")
_live: dict[str, Callable[[], int]] = {}  # label -> rows done as the workers count them (see live_rows)


Function = TypeVar("Function", bound=Callable)


def operator_label(label: str) -> Callable[[Function], Function]:
    """Decorate a Ray Data map function with the label its operator's row shows (through `op_label`): Ray Data
    names the operator after the function (`MapBatches(<function name>)`), so the label is set here, and
    renaming the function leaves the display as it is. Only the function's `__name__` changes (pickling goes
    by `__qualname__`)."""

    def labelled(function: Function) -> Function:
        function.__name__ = label
        return function

    return labelled


def op_label(name: str) -> str:
    """A Ray Data operator name as a person reads it: 'ReadText->MapBatches(parse)' -> 'ReadText → parse',
    'MapBatches(EmbedSink)' -> 'embed', 'vLLMEngineStage' -> 'LLM generation (vLLM)'."""
    for key, label in _NAMED_OPS.items():
        if key in name:
            return label
    shown = _WRAPPER.sub(lambda m: m.group(1), re.sub(r"->SplitBlocks\(\d+\)", "", name))
    shown = re.sub(r"\b_+(?=\w)", "", shown.replace("->", " → ").replace("<lambda>", "λ"))
    return shown if len(shown) <= 48 else shown[:47] + "…"


def rate_and_eta(done: int, total: int | None, elapsed_s: float) -> tuple[float | None, float | None]:
    """(items per second, seconds left) from the progress so far; None where it cannot be known yet."""
    if elapsed_s <= 0 or done <= 0:
        return None, None
    rate = done / elapsed_s
    return rate, ((total - done) / rate if total is not None and total >= done else None)


def shown_ops(labels: list[str]) -> list[int]:
    """Positions of the operators worth a row: the named ones, which do a stage's real work, if any (the
    vLLM processor alone has eight operators: tokenizers, templates, projections, the write), else all."""
    return [i for i, lb in enumerate(labels) if lb in _NAMED_OPS.values()] or list(range(len(labels)))


def status_line(stage: str, ops: list[tuple[str, int, int | None, float]]) -> str:
    """One plain line for logs from (label, done, total, seconds since the operator started) per operator."""
    parts = []
    for label, done, total, elapsed_s in ops:
        rate, eta = rate_and_eta(done, total, elapsed_s)
        parts.append(f"{label} {done}/{total if total is not None else '?'} rows"
                     + (f", {rate:.1f}/s" if rate is not None else "")
                     + (f", ETA {_fmt_s(eta)}" if eta is not None else ""))
    return f"… {stage}: " + ("; ".join(parts) if parts else "running")


def _fmt_s(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class _RateColumn(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed:.1f}/s" if task.speed else "", style="progress.data.speed")


def _ops_only(column: type[ProgressColumn]) -> type[ProgressColumn]:
    """A column that stays blank on stage rows (a stage shows its name and elapsed time only)."""

    class OpsOnly(column):  # type: ignore[valid-type, misc]
        def render(self, task):
            return Text("") if task.fields.get("stage") else super().render(task)

    return OpsOnly


class _EtaColumn(TimeRemainingColumn):
    def render(self, task) -> Text:
        return Text("") if task.fields.get("stage") or task.total is None else Text("ETA ") + super().render(task)


@dataclass
class _Stage:
    name: str
    task: TaskID
    started: float = field(default_factory=time.perf_counter)
    ops: dict = field(default_factory=dict)  # (execution id, op position) -> the operator's task


class Display:
    """The display bound to one console (stderr); operators live under the innermost open stage. Off a
    terminal the rich Progress is disabled but still holds the rows the status line reads."""

    def __init__(self, console: Console):
        self.console = console
        self.live = console.is_terminal and not os.environ.get("QRAG_NO_PROGRESS")
        self.progress = Progress(
            TextColumn("{task.description}"), _ops_only(BarColumn)(bar_width=28), _ops_only(MofNCompleteColumn)(),
            _ops_only(_RateColumn)(), TimeElapsedColumn(), _EtaColumn(),
            console=console, transient=True, disable=not self.live, refresh_per_second=4)
        self.stages: list[_Stage] = []
        self.lock = threading.RLock()
        self.last_line = time.monotonic()
        try:  # seconds between status lines off a terminal
            self.interval = float(os.environ.get("QRAG_PROGRESS_INTERVAL", "30"))
        except ValueError:
            self.interval = 30.0

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[_Stage]:
        with self.lock:
            if not self.stages:
                self.progress.start()
            current = _Stage(name, self.progress.add_task(f"[bold cyan]▶ {name}[/]", total=None, stage=True))
            self.stages.append(current)
            self.last_line = time.monotonic()
        try:
            yield current
        finally:
            with self.lock:
                for task in [current.task, *current.ops.values()]:
                    self.progress.remove_task(task)
                self.stages.remove(current)
                if not self.stages:
                    self.progress.stop()
        # reached only when the stage succeeded: a failed stage leaves its error line alone
        self.console.print(f"  [green]✓[/] {name} ({time.perf_counter() - current.started:.1f}s)", highlight=False)

    def report(self, execution: str, ops: list[tuple[int, str, int, int | None]], finished: bool = False) -> None:
        """From Ray Data's executor thread; ops: (position, operator name, rows done, total or None)."""
        with self.lock:
            if not self.stages:
                return
            current = self.stages[-1]
            labels = [op_label(o[1]) for o in ops]
            for i in shown_ops(labels):
                pos, _, done, total = ops[i]
                if labels[i] in _live:
                    done = max(done, _live[labels[i]]())
                # a total the count has passed was an estimate: unknown, never the count so far
                total = total if total is None or total >= done else None
                if (execution, pos) not in current.ops:
                    if finished:
                        continue
                    current.ops[execution, pos] = self.progress.add_task(f"   {labels[i]}", total=total,
                                                                         label=labels[i])
                self.progress.update(current.ops[execution, pos], completed=done, total=total)
                if total is None:  # rich's update leaves a total it is given as None alone
                    next(t for t in self.progress.tasks if t.id == current.ops[execution, pos]).total = None
            if finished:
                for key in [k for k in current.ops if k[0] == execution]:
                    self.progress.remove_task(current.ops.pop(key))
            elif not self.live and time.monotonic() - self.last_line >= self.interval:
                self.last_line = time.monotonic()
                rows = [(t.fields["label"], int(t.completed), t.total, t.elapsed or 0.0)
                        for t in self.progress.tasks if t.id in current.ops.values()]
                self.console.print(status_line(current.name, rows), highlight=False, soft_wrap=True)


_displays: dict[Console, Display] = {}
_current: Display | None = None


@contextlib.contextmanager
def stage(console: Console | None, name: str) -> Iterator[None]:
    """Show `name` as a running stage on `console` (no console: nothing shown), with the Ray Data
    operators that run inside it."""
    global _current
    if console is None:
        yield
        return
    display = _displays.get(console) or _displays.setdefault(console, Display(console))
    prev = _current
    _current = display
    try:
        with display.stage(name):
            yield
    finally:
        _current = prev


@contextlib.contextmanager
def live_rows(label: str, rows: Callable[[], int]) -> Iterator[None]:
    """Inside, the operator row `label` shows at least `rows()`, the workers' own count (Ray Data counts a
    batch's rows only once all of it is done)."""
    _live[label] = rows
    try:
        yield
    finally:
        _live.pop(label, None)


def current() -> Display | None:
    """The display of the innermost running stage (None outside any)."""
    return _current
