"""`from trainer.lightning_cli import LightningCLI`: Lightning's command line, running our Trainer.

A LightningCLI program switches to our Trainer by changing one import and nothing else: the same
subcommands (`fit`, `validate`, `test`, `predict`), `--config` YAML files, `--trainer.*`, `--model.*` and
`--data.*` flags, `run=False`, `trainer_defaults`, `SaveConfigCallback`, and subclasses that override its
hooks (`add_arguments_to_parser`, `before_fit`, ...). Lightning's own `LightningCLI` refuses a Trainer
that is not a subclass of its own; here the parser also takes our `Trainer` (and our `LightningModule`,
`LightningDataModule` and `Callback` classes, and Lightning's of the other package), and everything else
is Lightning's code path.

**Which Lightning.** Lightning ships its CLI twice, in `lightning.pytorch` and in `pytorch_lightning`, and
each copy accepts only its own package's classes. `LightningCLI`, `ArgumentParser` and `SaveConfigCallback`
here are bound to one of them when they are instantiated, by this rule:

1. the package the classes handed to the CLI derive from (`model_class`, `datamodule_class`, `trainer_class`,
   `save_config_callback`, `parser_class`, the objects in `trainer_defaults`: the first Lightning class among
   the arguments, in the order given), then the CLI subclass's own bases;
2. else the package the program has imported (`lightning.pytorch` when both are);
3. else the one installed (`lightning` first).

So a program written against `lightning.pytorch` never needs `pytorch_lightning`, and the other way round.
An instance's class is then the program's class with that package's class as its next base:
`isinstance(cli, lightning.pytorch.cli.LightningCLI)` holds for the package chosen.

This is the only module of `trainer` that imports Lightning (and jsonargparse, which Lightning's CLI
needs: `pip install "jsonargparse[signatures]"`, or this project's `[lightning-cli]` extra), and only
when one of these classes is instantiated.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Iterator
from typing import Any, ClassVar

from strategies.lightning_types import PACKAGES, derives_from, loaded_packages, package_of
from trainer.callbacks import Callback
from trainer.datamodule import LightningDataModule
from trainer.module import LightningModule
from trainer.trainer import Trainer

_OUR_CLASSES = (Trainer, LightningModule, LightningDataModule, Callback)
_LIGHTNING_CLASSES = ("Trainer", "LightningModule", "LightningDataModule", "callbacks.Callback")
_bound: dict[tuple[type, str], type] = {}


def choose_package(*hints: Any) -> str:
    """The Lightning package to run under (the rule in the module docstring), imported."""
    for hint in _flatten(hints):
        cls = hint if isinstance(hint, type) else type(hint)
        package = package_of(cls)
        if package is not None:
            return _import(package)
    loaded = loaded_packages()
    if loaded:
        return loaded[0]
    for package in PACKAGES:
        if importlib.util.find_spec(package.partition(".")[0]) is not None:
            return _import(package)
    raise ImportError("trainer.lightning_cli needs Lightning's CLI: `pip install lightning \"jsonargparse[signatures]\"` "
                      "(or `pip install 'ddp-trainer[lightning-cli]'`).")


def _import(package: str) -> str:
    try:
        importlib.import_module(f"{package}.cli")
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(f"trainer.lightning_cli runs {package}'s LightningCLI, which needs jsonargparse: "
                          "`pip install \"jsonargparse[signatures]\"` (or `pip install 'ddp-trainer[lightning-cli]'`)"
                          f"; importing {package}.cli failed: {error}") from error
    return package


def _flatten(values: Any) -> Iterator[Any]:
    for value in values:
        if isinstance(value, dict):
            yield from _flatten(value.values())
        elif isinstance(value, (list, tuple)):
            yield from _flatten(value)
        elif value is not None and not isinstance(value, (str, int, float, bool)):
            yield value


class _BoundToLightning:
    """A class whose Lightning base is chosen when it is instantiated (see the module docstring).

    `_lightning_name` names the Lightning class (in `<package>.cli`) the instance's class derives from:
    the instance's class is `type(name, (cls, <package>.cli.<name>), {})`, made once per class and
    package, so a subclass's overrides come first and `super()` reaches Lightning's implementation.
    """

    _lightning_name: ClassVar[str]
    _lightning_package: ClassVar[str | None] = None  # set on the bound classes only

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls._lightning_package is None:
            cls = bind(cls, choose_package(cls, args, kwargs))
        return object.__new__(cls)


def bind(cls: type, package: str) -> type:
    """`cls` (a subclass of one of this module's classes) bound to `package`'s Lightning class."""
    if not (isinstance(cls, type) and issubclass(cls, _BoundToLightning)) or cls._lightning_package is not None:
        return cls
    key = (cls, package)
    if key not in _bound:
        lightning_class = getattr(importlib.import_module(f"{package}.cli"), cls._lightning_name)
        _bound[key] = type(cls.__name__, (cls, lightning_class),
                           {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                            "__doc__": cls.__doc__, "_lightning_package": package})
    return _bound[key]


class ArgumentParser(_BoundToLightning):
    """Lightning's CLI parser (`LightningArgumentParser`), which also adds the arguments of our Trainer,
    modules and callbacks, and of Lightning's classes from the other Lightning package."""

    _lightning_name = "LightningArgumentParser"
    callback_keys: list[str]

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        cls = _as_class(lightning_class)
        own_package = type(self)._lightning_package
        theirs = isinstance(cls, type) and package_of(cls) not in (None, own_package) and any(
            derives_from(cls, path) for path in _LIGHTNING_CLASSES)
        if not (isinstance(cls, type) and (issubclass(cls, _OUR_CLASSES) or theirs)):
            return super().add_lightning_class_args(lightning_class, nested_key,  # type: ignore[misc, no-any-return]
                                                    subclass_mode, required)
        if issubclass(cls, Callback) or derives_from(cls, "callbacks.Callback"):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(cls, nested_key, fail_untyped=False,  # type: ignore[attr-defined, no-any-return]
                                               required=required)
        # The Trainer is built by the CLI itself (with the callbacks it adds), the others by the parser.
        is_trainer = issubclass(cls, Trainer) or derives_from(cls, "Trainer")
        return self.add_class_arguments(cls, nested_key, fail_untyped=False,  # type: ignore[attr-defined, no-any-return]
                                        instantiate=not is_trainer, sub_configs=True)


def _as_class(lightning_class: Any) -> Any:
    """A class, or the class a builder function returns (as Lightning's CLI takes either)."""
    if callable(lightning_class) and not isinstance(lightning_class, type):
        from jsonargparse import class_from_function

        return class_from_function(lightning_class)
    return lightning_class


class SaveConfigCallback(_BoundToLightning):
    """Lightning's `SaveConfigCallback` (writes the parsed config to the log directory), of the package the
    CLI runs under; subclass it to override `save_config`, as in Lightning."""

    _lightning_name = "SaveConfigCallback"


class LightningCLI(_BoundToLightning):
    """Lightning's `LightningCLI` with our `Trainer` as its default `trainer_class`.

    Takes exactly Lightning's arguments. `trainer_class` may still name another Trainer (ours, a subclass
    of ours, or Lightning's), and `parser_class` a subclass of `ArgumentParser` above.
    """

    _lightning_name = "LightningCLI"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls._lightning_package is None:  # the CLI's own bases count among the hints (rule 1)
            cls = bind(cls, choose_package(args, kwargs, cls))
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        package = type(self)._lightning_package
        if package is None:  # pragma: no cover - __new__ always binds
            raise TypeError("LightningCLI was not bound to a Lightning package.")
        lightning_cli = getattr(importlib.import_module(f"{package}.cli"), "LightningCLI")
        given = inspect.signature(lightning_cli.__init__).bind_partial(self, *args, **kwargs).arguments
        given.pop("self")
        given.setdefault("trainer_class", Trainer)
        given["parser_class"] = bind(given.get("parser_class", ArgumentParser), package)
        if "save_config_callback" in given:
            given["save_config_callback"] = bind(given["save_config_callback"], package)
        super().__init__(**given)


__all__ = ["ArgumentParser", "LightningCLI", "SaveConfigCallback", "bind", "choose_package"]
