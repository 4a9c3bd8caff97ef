"""Strategies: where and how the training loop runs (devices, processes, gradient sync).

Importing this package is cheap: torch elastic, the reducer and the launcher are imported
only when a strategy actually launches or sets up a module.
"""

from __future__ import annotations

from strategies.base import Strategy
from strategies.ddp import DDPStrategy
from strategies.single_device import SingleDeviceStrategy

__all__ = ["DDPStrategy", "SingleDeviceStrategy", "Strategy", "resolve_strategy"]

STRATEGY_NAMES = ("auto", "ddp", "single")


def resolve_strategy(strategy: str | Strategy, devices: int, num_nodes: int) -> Strategy:
    """Turn the Trainer's `strategy=` argument into a Strategy ("auto": one process -> single)."""
    if isinstance(strategy, Strategy):
        return strategy
    if strategy == "auto":
        strategy = "single" if devices * num_nodes == 1 else "ddp"
    if strategy == "ddp":
        return DDPStrategy()
    if strategy == "single":
        return SingleDeviceStrategy()
    raise ValueError(f"strategy={strategy!r} is not supported; expected one of {STRATEGY_NAMES} "
                     f"or a Strategy instance.")
