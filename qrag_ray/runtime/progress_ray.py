"""The Ray Data side of the progress display: an ExecutionCallback reading the running operators' row
counters on the driver. A module of its own, importable by name: the DataContext listing this class
travels to Ray workers, and a class defined in a function would be pickled by value with the display."""

from __future__ import annotations

import os
import time

from ray.data._internal.execution.execution_callback import ExecutionCallback
from ray.data._internal.execution.operators.input_data_buffer import InputDataBuffer
from ray.data._internal.execution.operators.map_operator import MapOperator
from ray.data._internal.execution.operators.union_operator import UnionOperator

from qrag_ray.runtime import progress


def operator_counts(topology) -> list[tuple[int, str, int, int | None]]:
    """(position, name, rows output so far, total or None) per operator but the input buffers. A
    one-to-one operator's total is exact or None (see `exact_rows`); another's is Ray Data's estimate."""
    return [(pos, op.name, int(op.metrics.rows_task_outputs_generated or 0),
             exact_rows(op) if _one_to_one(op) else op.num_output_rows_total())
            for pos, op in enumerate(topology or {}) if not isinstance(op, InputDataBuffer)]


def exact_rows(operator) -> int | None:
    """The rows `op` outputs in all where that is certain, else None: a finished operator's count, a
    union's inputs' sum, a one-to-one operator's input's. Ray Data's own estimate extrapolates from the
    blocks so far and drops as blocks of other sizes arrive, so it is never shown as a total here."""
    if isinstance(operator, UnionOperator):
        parts = [exact_rows(d) for d in operator.input_dependencies]
        return None if None in parts else sum(parts)
    if operator.has_execution_finished():
        if isinstance(operator, MapOperator):
            return int(operator.metrics.rows_task_outputs_generated or 0)
        if isinstance(operator, InputDataBuffer):  # a materialized dataset's blocks
            return operator.num_output_rows_total()
        return None
    return exact_rows(operator.input_dependencies[0]) if _one_to_one(operator) and operator.input_dependencies else None


def _one_to_one(operator) -> bool:
    return any(k in operator.name for k in progress.ONE_TO_ONE)


class RayDataProgress(ExecutionCallback):
    """One per dataset execution (Ray Data instantiates the classes listed in the DataContext)."""

    every_s = 0.25  # how often the counters are read
    last = 0.0  # when they were last

    def _send(self, executor, finished: bool = False) -> None:
        if (display := progress.current()) is not None:
            ops = operator_counts(getattr(executor, "_topology", None))
            display.report(str(getattr(executor, "_dataset_id", id(executor))), ops, finished)

    def on_execution_step(self, executor) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._send(executor)

    def after_execution_fails(self, executor, error: Exception | None = None) -> None:
        self._send(executor, finished=True)

    def after_execution_succeeds(self, executor) -> None:
        self._send(executor, finished=True)


def attach_ray_data(ctx) -> None:
    """Register the display's callback in a Ray Data context (once) and turn Ray Data's own bars and
    per-execution prints off (QRAG_PROGRESS=1 keeps Ray Data's bars, for debugging them)."""
    if RayDataProgress not in ctx.custom_execution_callback_classes:
        ctx.custom_execution_callback_classes.append(RayDataProgress)
    ctx.enable_progress_bars = os.environ.get("QRAG_PROGRESS") == "1"
    ctx.print_on_execution_start = False
