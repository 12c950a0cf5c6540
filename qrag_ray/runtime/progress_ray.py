"""The Ray Data side of the progress display: an ExecutionCallback reading the running operators' row
counters on the driver. A module of its own, importable by name: the DataContext listing this class
travels to Ray workers, and a class defined in a function would be pickled by value with the display."""

from __future__ import annotations

import os
import time

from ray.data._internal.execution.execution_callback import ExecutionCallback
from ray.data._internal.execution.operators.input_data_buffer import InputDataBuffer

from qrag_ray.runtime import progress


def operator_counts(topology) -> list[tuple[int, str, int, int | None]]:
    """(position, name, rows output so far, estimated total or None) per operator but the input buffers."""
    return [(pos, op.name, int(op.metrics.rows_task_outputs_generated or 0), _total(op))
            for pos, op in enumerate(topology or {}) if not isinstance(op, InputDataBuffer)]


def _total(op) -> int | None:
    total = op.num_output_rows_total()
    if total is None and any(k in op.name for k in progress.ONE_TO_ONE) and op.input_dependencies:
        total = op.input_dependencies[0].num_output_rows_total()
    return total


class RayDataProgress(ExecutionCallback):
    """One per dataset execution (Ray Data instantiates the classes listed in the DataContext)."""

    every_s, last = 0.25, 0.0  # how often the counters are read; when they were last

    def _send(self, executor, finished: bool = False) -> None:
        if (d := progress.current()) is not None:
            ops = operator_counts(getattr(executor, "_topology", None))
            d.report(str(getattr(executor, "_dataset_id", id(executor))), ops, finished)

    def on_execution_step(self, executor) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._send(executor)

    def after_execution_fails(self, executor, error: Exception | None = None) -> None:
        self._send(executor, finished=True)

    after_execution_succeeds = after_execution_fails


def attach_ray_data(ctx) -> None:
    """Register the display's callback in a Ray Data context (once) and turn Ray Data's own bars and
    per-execution prints off (QRAG_PROGRESS=1 keeps Ray Data's bars, for debugging them)."""
    if RayDataProgress not in ctx.custom_execution_callback_classes:
        ctx.custom_execution_callback_classes.append(RayDataProgress)
    ctx.enable_progress_bars = os.environ.get("QRAG_PROGRESS") == "1"
    ctx.print_on_execution_start = False
