"""`ddp-train`, the Hydra command line, kept apart from the runtime it drives.

Hydra and OmegaConf stay inside this package: the Trainer, the strategies and the loops never
import it and never see a `DictConfig`. Its modules, in the order a run meets them:

* `config`: the structured configs Hydra checks `conf/` against, and where `conf/` is;
* `strategy_schema`: a strategy group's schema, read off the strategy's constructor;
* `errors`: one line for every way a composed config can be wrong;
* `command`: the entry point (`ddp-train`, `python -m trainer`): compose, validate, build, fit.
"""

from trainer.cli.command import ValidateConfig, main
from trainer.cli.config import ConfigError, validate

__all__ = ["ConfigError", "ValidateConfig", "main", "validate"]
