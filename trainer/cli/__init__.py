"""`ddp-train`, the Hydra command line, kept apart from the runtime it drives.

Hydra and OmegaConf stay inside this package: the Trainer, the strategies and the loops never
import it and never see a `DictConfig`. Its modules, in the order a run meets them:

* `schemas`: the structured configs Hydra checks `conf/` against, and where `conf/` is;
* `signature_schema`: the Trainer's and the strategies' schemas, read off their signatures;
* `run_dir`: the run directory's name (a Hydra resolver) and path;
* `checks`: what the types can't express, checked before any worker starts;
* `errors`: `ConfigError` and one line for every way a composed config can be wrong;
* `command`: the entry point (`ddp-train`, `python -m trainer`): compose, validate, build, fit.
"""

from trainer.cli.command import ValidateConfig, main
from trainer.cli.checks import validate
from trainer.cli.errors import ConfigError

__all__ = ["ConfigError", "ValidateConfig", "main", "validate"]
