"""ModelSummary: Lightning's callback that prints the model's layers and parameter counts when
fitting starts (added by `enable_model_summary=True`)."""

from __future__ import annotations

from typing import Any

from torch import nn
from typing_extensions import override

from trainer.callbacks.base import Callback
from trainer.contract import TrainerContract


class ModelSummary(Callback):
    """Print, on global rank 0, each submodule down to `max_depth` (0 prints nothing, -1 every
    level) with its type and parameter count, then the totals and where the job runs."""

    def __init__(self, max_depth: int = 1) -> None:
        if not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"ModelSummary(max_depth={max_depth!r}); expected -1 (all), 0 (off) or a positive int.")
        self._max_depth = max_depth

    @override
    def on_fit_start(self, trainer: TrainerContract, pl_module: Any) -> None:
        if self._max_depth == 0 or not trainer.is_global_zero:
            return
        print(summarize(pl_module, self._max_depth, trainer))


def summarize(module: nn.Module, max_depth: int, trainer: TrainerContract | None = None) -> str:
    rows = [(name, type(child).__name__, _count(child)) for name, child in module.named_modules()
            if name and (max_depth == -1 or name.count(".") < max_depth)]
    width = max([len(name) for name, _, _ in rows] + [4])
    lines = [f"  | {'Name':<{width}} | Type                 | Params"]
    lines += [f"{i:<2}| {name:<{width}} | {kind:<20} | {params:,}" for i, (name, kind, params) in enumerate(rows)]
    total = _count(module)
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    lines.append(f"{trainable:,} trainable params, {total - trainable:,} non-trainable, {total:,} total")
    if trainer is not None:
        lines.append(f"{type(trainer.strategy).__name__} world_size={trainer.world_size} | precision {trainer.precision}")
    return "\n".join(lines)


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
