"""TelemetryMonitor: where each training step's time goes, to the loggers and the progress bar.

The callback times the compute phases itself from the hooks around them (no change to the
loops, no device synchronisation):

    on_train_batch_start ─ forward ─▶ on_before_backward ─ backward (+ exposed comm) ─▶
    on_after_backward ─ ... ─▶ on_before_optimizer_step ─ clip, step, zero_grad ─▶ on_train_batch_end

and reads the communication side from `trainer.strategy.summary()["reducer"]` (present with
`DDPStrategy`): exposed communication (waiting for all-reduce after backward ended), total
communication, overlap = 1 - exposed / total, and the bucket plan. Every `log_every_n_steps`
optimizer steps it computes window averages (per optimizer step, in ms; `last_report`), sends
them to the loggers under `telemetry/` when asked to, and shows overlap % and exposed ms in our
progress bar's text (`progress_bar_figures`); when asked (`print_summary=True`), global rank 0
prints one line for the whole run at the end of fit. Times are host times: on CUDA they show when
work was issued.

The Trainer adds one by default (`enable_telemetry=True`) that writes to no logger, puts nothing in
`trainer.progress_bar_metrics`/`callback_metrics`/`logged_metrics` and prints nothing, so what a
Lightning program reads or prints holds only what it logged. Pass `callbacks=[TelemetryMonitor()]`
to have the `telemetry/*` rows in TensorBoard, CSV or any other logger, and
`TelemetryMonitor(print_summary=True)` for the `telemetry:` line at fit end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

from typing_extensions import override

from trainer.callbacks.base import Callback
from trainer.contract import TrainerContract

PREFIX = "telemetry/"


@dataclass
class _Window:
    """Sums over optimizer steps since the last report (seconds)."""

    steps: int = 0
    forward: float = 0.0
    backward: float = 0.0  # on_before_backward -> on_after_backward: compute + exposed communication
    optimizer: float = 0.0
    step: float = 0.0

    def add(self, other: _Window) -> None:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))


class TelemetryMonitor(Callback):
    """Per-step forward / backward / exposed communication / optimizer times and overlap %.

    `prog_bar` shows `overlap` (%) and `exposed_ms` in our progress bar's text (never in the
    Trainer's metrics dicts: those hold what the program logged); `print_summary` prints one line
    on global rank 0 when fit ends; `log_to_loggers` sends each window's averages to every logger
    under `telemetry/`.
    """

    def __init__(self, prog_bar: bool = True, print_summary: bool = False, log_to_loggers: bool = True) -> None:
        self.prog_bar, self.print_summary, self.log_to_loggers = prog_bar, print_summary, log_to_loggers
        self.progress_bar_figures: dict[str, float] = {}  # what our progress bar adds to its text
        self._marks: dict[str, float] = {}
        self._window, self._fit = _Window(), _Window()
        self._comm_seen = {"synced_steps": 0, "exposed_comm_s_total": 0.0, "comm_s_total": 0.0}
        self._comm_fit = {"synced_steps": 0, "exposed_comm_s_total": 0.0, "comm_s_total": 0.0}
        self._steps_before = 0
        self.last_report: dict[str, float] = {}

    # ------------------------------------------------------------------ timing hooks
    @override
    def on_train_start(self, trainer: TrainerContract, pl_module: Any) -> None:
        self._comm_seen = self._comm_fit = _comm_totals(_reducer_summary(trainer))

    @override
    def on_train_batch_start(self, trainer: TrainerContract, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._marks = {"start": time.perf_counter()}
        self._steps_before = trainer.global_step

    @override
    def on_before_backward(self, trainer: TrainerContract, pl_module: Any, loss: Any) -> None:
        self._marks["before_backward"] = time.perf_counter()

    @override
    def on_after_backward(self, trainer: TrainerContract, pl_module: Any) -> None:
        self._marks["after_backward"] = time.perf_counter()

    @override
    def on_before_optimizer_step(self, trainer: TrainerContract, pl_module: Any, optimizer: Any) -> None:
        self._marks["before_optimizer"] = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer: TrainerContract, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        end, marks = time.perf_counter(), self._marks
        if "start" not in marks:
            return  # a batch that never started (a None batch the loop skipped): nothing ran, nothing to count
        self._marks = {}
        start = marks["start"]
        backward_start = marks.get("before_backward", end)
        window = self._window
        window.forward += backward_start - start
        window.backward += marks.get("after_backward", backward_start) - backward_start
        window.step += end - start
        if "before_optimizer" in marks:
            window.optimizer += end - marks["before_optimizer"]
        if trainer.global_step == self._steps_before:
            return  # a micro-batch inside an accumulation window: the step is not complete yet
        window.steps += trainer.global_step - self._steps_before
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            self._report(trainer)

    @override
    def on_train_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        if self._window.steps:
            self._report(trainer)
        if self.print_summary and trainer.is_global_zero and self._fit.steps:
            trainer.print(self.summary_line(trainer))

    # ------------------------------------------------------------------ reporting
    def _report(self, trainer: TrainerContract) -> None:
        reducer = _reducer_summary(trainer)
        comm = _comm_totals(reducer)
        metrics = _window_metrics(self._window, _delta(comm, self._comm_seen), reducer)
        self._comm_seen = comm
        self._fit.add(self._window)
        self._window = _Window()
        self.last_report = metrics
        if self.prog_bar and "overlap_pct" in metrics:
            self.progress_bar_figures = {"overlap": round(metrics["overlap_pct"], 1),
                                         "exposed_ms": round(metrics["exposed_comm_ms"], 2)}
        if trainer.is_global_zero and self.log_to_loggers:
            logged = {PREFIX + key: value for key, value in metrics.items()}
            for logger in trainer.loggers:
                logger.log_metrics(metrics=logged, step=trainer.logger_step)

    def fit_metrics(self, trainer: TrainerContract) -> dict[str, float]:
        """Per-step averages (ms, %) over every optimizer step of this fit so far."""
        whole = _Window()
        whole.add(self._fit)
        whole.add(self._window)
        reducer = _reducer_summary(trainer)
        return {"steps": float(whole.steps),
                **_window_metrics(whole, _delta(_comm_totals(reducer), self._comm_fit), reducer)}

    def summary_line(self, trainer: TrainerContract) -> str:
        """One line for the whole fit: mean step split into phases, overlap and the bucket plan."""
        reducer = _reducer_summary(trainer)
        metrics = self.fit_metrics(trainer)
        line = (f"telemetry: {int(metrics['steps'])} steps, {metrics['step_ms']:.1f} ms/step = forward "
                f"{metrics['forward_ms']:.1f} + backward {metrics['backward_ms']:.1f}")
        if reducer is None:
            return line + f" + optimizer {metrics['optimizer_ms']:.1f} (+ other)"
        line += (f" + exposed comm {metrics['exposed_comm_ms']:.1f} + optimizer {metrics['optimizer_ms']:.1f}"
                 f" (+ other) | comm {metrics['comm_ms']:.1f} ms, overlap {metrics['overlap_pct']:.0f}%")
        sizes = ", ".join(f"{size:.2f}" for size in reducer["bucket_sizes_mib"])
        autotune = reducer.get("autotune") or {}
        cap = f"auto -> {autotune.get('chosen_mb')}" if autotune else reducer.get("bucket_cap_mb")
        count = reducer["buckets"]
        return line + f" | {count} bucket{'' if count == 1 else 's'} [{sizes}] MiB, bucket_cap_mb={cap}"


def _reducer_summary(trainer: TrainerContract) -> dict[str, Any] | None:
    summary = trainer.strategy.summary()
    reducer = summary.get("reducer") if isinstance(summary, dict) else None
    return reducer if isinstance(reducer, dict) else None


def _comm_totals(reducer: dict[str, Any] | None) -> dict[str, float]:
    keys = ("synced_steps", "exposed_comm_s_total", "comm_s_total")
    return {key: float(reducer.get(key, 0.0)) if reducer else 0.0 for key in keys}


def _delta(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: now[key] - before.get(key, 0.0) for key in now}


def _window_metrics(window: _Window, comm: dict[str, float], reducer: dict[str, Any] | None) -> dict[str, float]:
    """Per optimizer step, in ms; backward excludes the exposed communication it waited for."""
    steps = max(1, window.steps)
    ms = 1e3 / steps
    metrics = {"step_ms": window.step * ms, "forward_ms": window.forward * ms, "optimizer_ms": window.optimizer * ms}
    exposed = comm["exposed_comm_s_total"] if reducer is not None else 0.0
    metrics["backward_ms"] = max(0.0, window.backward - exposed) * ms
    if reducer is None:
        return metrics
    total = comm["comm_s_total"]
    metrics.update(exposed_comm_ms=exposed * ms, comm_ms=total * ms,
                   overlap_pct=100.0 * (min(1.0, max(0.0, 1.0 - exposed / total)) if total > 0 else 1.0),
                   buckets=float(reducer["buckets"]), bucket_cap_mb=float(reducer["bucket_cap_mb"]))
    return metrics
