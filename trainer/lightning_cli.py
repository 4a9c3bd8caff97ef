"""`from trainer.lightning_cli import LightningCLI`: Lightning's command line, running our Trainer.

A LightningCLI program switches to our Trainer by changing one import and nothing else: the same
subcommands (`fit`, `validate`, `test`, `predict`), `--config` YAML files, `--trainer.*`, `--model.*` and
`--data.*` flags, `run=False`, `trainer_defaults`, `SaveConfigCallback`, and subclasses that override its
hooks (`add_arguments_to_parser`, `before_fit`, ...). Lightning's own `LightningCLI` refuses a Trainer
that is not a subclass of its own; here the parser also takes our `Trainer` (and our `LightningModule`,
`LightningDataModule` and `Callback` classes), and everything else is Lightning's code path.

This is the only module of `trainer` that imports Lightning (and jsonargparse, which Lightning's CLI
needs: `pip install "jsonargparse[signatures]"`, or this project's `[lightning-cli]` extra).
"""

from __future__ import annotations

import inspect
from typing import Any

try:
    from pytorch_lightning.cli import LightningArgumentParser, SaveConfigCallback
    from pytorch_lightning.cli import LightningCLI as _LightningCLI
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("trainer.lightning_cli needs pytorch_lightning; install it with "
                      "`pip install 'ddp-trainer[lightning-cli]'`.") from error

from trainer.callbacks import Callback
from trainer.datamodule import LightningDataModule
from trainer.module import LightningModule
from trainer.trainer import Trainer

_OUR_CLASSES = (Trainer, LightningModule, LightningDataModule, Callback)


class ArgumentParser(LightningArgumentParser):
    """Lightning's CLI parser, which also adds the arguments of our Trainer, modules and callbacks."""

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        cls = _as_class(lightning_class)
        if not (isinstance(cls, type) and issubclass(cls, _OUR_CLASSES)):
            return super().add_lightning_class_args(lightning_class, nested_key, subclass_mode, required)
        if issubclass(cls, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(cls, nested_key, fail_untyped=False, required=required)
        # The Trainer is built by the CLI itself (with the callbacks it adds), the others by the parser.
        return self.add_class_arguments(cls, nested_key, fail_untyped=False, instantiate=not issubclass(cls, Trainer),
                                        sub_configs=True)


def _as_class(lightning_class: Any) -> Any:
    """A class, or the class a builder function returns (as Lightning's CLI takes either)."""
    if callable(lightning_class) and not isinstance(lightning_class, type):
        from jsonargparse import class_from_function

        return class_from_function(lightning_class)
    return lightning_class


class LightningCLI(_LightningCLI):
    """Lightning's `LightningCLI` with our `Trainer` as its default `trainer_class`.

    Takes exactly Lightning's arguments. `trainer_class` may still name another Trainer (ours, a subclass
    of ours, or Lightning's), and `parser_class` a subclass of `ArgumentParser` above.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = inspect.signature(_LightningCLI.__init__).bind_partial(self, *args, **kwargs).arguments
        given.pop("self")
        given.setdefault("trainer_class", Trainer)
        given.setdefault("parser_class", ArgumentParser)
        super().__init__(**given)


__all__ = ["ArgumentParser", "LightningCLI", "SaveConfigCallback"]
