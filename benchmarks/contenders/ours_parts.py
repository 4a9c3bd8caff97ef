"""The LightningModule and probe callback of our-Trainer contenders, importable by name
(spawned workers unpickle them from here rather than from `__main__`)."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.probe import Probe
from benchmarks.workloads import BenchSteps
from trainer import LightningModule
from trainer.callbacks import Callback


class BenchModule(BenchSteps, LightningModule):
    pass


class ProbeCallback(Callback):
    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.loss: float | None = None
        self.at_warmup_end: dict[str, float] | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if len(self.probe.ends) == self.probe.warmup and self.at_warmup_end is None:
            self.at_warmup_end = _telemetry(trainer)  # every hook of the last warm-up step has run

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.probe.step_end(batch)
        if len(self.probe.ends) == self.probe.total_steps:
            self.loss = float(outputs["loss"].detach())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        reducer = (trainer.strategy.summary().get("reducer") or {})
        extra = {"threads": torch.get_num_threads(),
                 "telemetry": _steady(_telemetry(trainer), self.at_warmup_end),
                 "reducer": {key: reducer.get(key) for key in ("buckets", "bucket_sizes_mib", "bucket_cap_mb",
                                                               "autotune", "overlap_mean", "synced_steps",
                                                               "exposed_comm_s_total", "comm_s_total")}}
        self.probe.finish(trainer.global_rank, self.loss, extra)


def _telemetry(trainer: Any) -> dict[str, float] | None:
    monitor = next((c for c in trainer.callbacks if type(c).__name__ == "TelemetryMonitor"), None)
    return monitor.fit_metrics(trainer) if monitor is not None else None


def _steady(end: dict[str, float] | None, warm: dict[str, float] | None) -> dict[str, float] | None:
    """Per-step averages over the measured steps only: (totals at the end - at warm-up end) / steps."""
    if end is None or warm is None or end["steps"] <= warm["steps"]:
        return end
    steps = end["steps"] - warm["steps"]
    result = {key: (end[key] * end["steps"] - warm[key] * warm["steps"]) / steps for key in end
              if key.endswith("_ms")}
    if "comm_ms" in result and result["comm_ms"] > 0:
        result["overlap_pct"] = 100.0 * min(1.0, max(0.0, 1.0 - result["exposed_comm_ms"] / result["comm_ms"]))
    return {"steps": steps, **result, **{k: end[k] for k in ("buckets", "bucket_cap_mb") if k in end}}
