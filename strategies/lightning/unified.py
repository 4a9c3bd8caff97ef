"""`LightningDDPStrategy` for the unified package: `lightning.pytorch.Trainer(strategy=...)`.

The same class as `strategies.lightning.LightningDDPStrategy`, built on `lightning.pytorch`'s
own `DDPStrategy` (each package's Trainer refuses the other's strategy objects). Importing this
module registers "bucket_ddp" and "bucket_ddp_spawn" with `lightning.pytorch`.
"""

from __future__ import annotations

import lightning.pytorch

from strategies.lightning.core import build_strategy_class, register_strategy_names

__all__ = ["LightningDDPStrategy"]

LightningDDPStrategy = build_strategy_class(lightning.pytorch.strategies.DDPStrategy, module=__name__)
register_strategy_names(LightningDDPStrategy, lightning.pytorch.strategies.StrategyRegistry)
