"""`LightningDDPStrategy`: our DDP reducer inside `pytorch_lightning.Trainer(strategy=...)`.

Importing this module registers "bucket_ddp" (and "bucket_ddp_spawn") with pytorch_lightning,
so an existing project switches with one argument. Projects on the unified `lightning` package
use `strategies.lightning.unified` instead. Nothing else in `strategies` or `trainer` imports
Lightning; the shared logic lives in `strategies.lightning.core`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from strategies.lightning.core import ReducedModule, ReducerOptions, build_strategy_class, register_strategy_names

__all__ = ["LightningDDPStrategy", "ReducedModule", "ReducerOptions"]

# Only with pytorch_lightning installed: a project on the unified `lightning` package alone must
# still be able to import `strategies.lightning.unified`, which runs this file first.
if importlib.util.find_spec("pytorch_lightning") is not None:
    import pytorch_lightning

    LightningDDPStrategy = build_strategy_class(pytorch_lightning.strategies.DDPStrategy, module=__name__)
    register_strategy_names(LightningDDPStrategy, pytorch_lightning.strategies.StrategyRegistry)
else:
    def __getattr__(name: str) -> Any:
        if name == "LightningDDPStrategy":
            raise ImportError("strategies.lightning.LightningDDPStrategy needs pytorch_lightning: "
                              "`pip install ddp-trainer[lightning]`, or, for projects importing `lightning`, "
                              "use `from strategies.lightning.unified import LightningDDPStrategy`.")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
