"""Strategies: where and how the training loop runs (devices, processes, gradient sync).

Importing this package is cheap: torch elastic, the reducer and the launcher are imported
only when a strategy actually launches or sets up a module.
"""

from __future__ import annotations

from strategies.base import Strategy
from strategies.ddp import DDPStrategy
from strategies.single_device import SingleDeviceStrategy

__all__ = ["DDPStrategy", "SingleDeviceStrategy", "Strategy", "resolve_strategy"]

# Lightning's strategy names, with Lightning's meaning, as DDPStrategy arguments. Lightning's fork
# variants (for notebooks and scripts whose classes a spawned worker cannot import) start workers
# from a forkserver here: no re-import of the script, the same as fork for the user, but safe
# whatever the launching process has initialised (OpenMP's threads, CUDA), which a plain fork is not.
_DDP_NAMES: dict[str, dict[str, object]] = {
    "ddp": {},
    "ddp_spawn": {"start_method": "spawn"},
    "ddp_fork": {"start_method": "forkserver"},
    "ddp_notebook": {"start_method": "forkserver"},
    "ddp_find_unused_parameters_true": {"find_unused_parameters": True},
    "ddp_find_unused_parameters_false": {},
    "ddp_spawn_find_unused_parameters_true": {"start_method": "spawn", "find_unused_parameters": True},
    "ddp_spawn_find_unused_parameters_false": {"start_method": "spawn"},
    "ddp_fork_find_unused_parameters_true": {"start_method": "forkserver", "find_unused_parameters": True},
    "ddp_fork_find_unused_parameters_false": {"start_method": "forkserver"},
    "ddp_notebook_find_unused_parameters_true": {"start_method": "forkserver", "find_unused_parameters": True},
    "ddp_notebook_find_unused_parameters_false": {"start_method": "forkserver"},
    "ddp_zero1": {"zero_stage": 1},  # ours: optimizer state sharded over the ranks (strategies/zero.py)
    "ddp_zero2": {"zero_stage": 2},  # ours: also the gradients (strategies/zero_reducer.py)
}
_SINGLE_NAMES = ("single", "single_device")
STRATEGY_NAMES = ("auto", *_DDP_NAMES, *_SINGLE_NAMES)


def resolve_strategy(strategy: str | Strategy, devices: int, num_nodes: int, sync_batchnorm: bool = False) -> Strategy:
    """Turn the Trainer's `strategy=` argument into a Strategy ("auto": one process -> single)."""
    if isinstance(strategy, Strategy):
        if sync_batchnorm:
            _enable_sync_batchnorm(strategy)
        return strategy
    if strategy == "auto":
        strategy = "single" if devices * num_nodes == 1 else "ddp"
    if strategy in _DDP_NAMES:
        return DDPStrategy(sync_batchnorm=sync_batchnorm, **_DDP_NAMES[strategy])  # type: ignore[arg-type]
    if strategy in _SINGLE_NAMES:
        return SingleDeviceStrategy()
    raise ValueError(f"strategy={strategy!r} is not supported; expected one of {STRATEGY_NAMES} "
                     f"or a Strategy instance.")


def _enable_sync_batchnorm(strategy: Strategy) -> None:
    """Trainer(sync_batchnorm=True) with a strategy instance: a distributed one converts the
    BatchNorm layers; one process has nothing to synchronise (its statistics are already global)."""
    if hasattr(strategy, "sync_batchnorm"):
        strategy.sync_batchnorm = True
