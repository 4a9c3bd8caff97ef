"""`Trainer(plugins=...)`: the one Lightning plug-in this Trainer takes is `AsyncCheckpointIO`.

Lightning's `AsyncCheckpointIO` asks for checkpoints written on a thread; here it turns on the
strategy's own `async_checkpoint` (strategies/async_checkpoint.py), which does that with a
snapshot of one step, one write in flight, atomic files and errors raised on the training side.
Precision and other checkpoint I/O have their own arguments (`precision=`,
`Strategy(checkpoint_io=...)`); any other plug-in is refused by name. Lightning is never imported:
its class is recognised by its name and package.
"""

from __future__ import annotations

from typing import Any

from trainer.validation import as_items

_LIGHTNING_PACKAGES = ("lightning.", "pytorch_lightning.", "lightning_fabric.")


def async_checkpoint_from_plugins(plugins: Any) -> bool:
    """Whether `plugins` asks for background checkpoint writes; a ValueError naming any plug-in we
    cannot honour."""
    if plugins is None:
        return False
    requested = False
    for plugin in as_items(plugins):
        if not _is_lightning(plugin, "AsyncCheckpointIO"):
            raise ValueError(f"Trainer(plugins={plugin!r}) is not supported by this Trainer; pass precision=... for "
                             "precision and a Strategy(checkpoint_io=...) for checkpoint I/O (of Lightning's "
                             "plug-ins only AsyncCheckpointIO is taken: it sets the strategy's async_checkpoint=True).")
        wrapped = getattr(plugin, "checkpoint_io", None)
        if wrapped is not None and not _is_lightning(wrapped, "TorchCheckpointIO", subclasses=False):
            raise ValueError(f"Trainer(plugins=[AsyncCheckpointIO(checkpoint_io={wrapped!r})]): this Trainer writes "
                             "checkpoints through its strategy's CheckpointIO; pass that instead: "
                             "DDPStrategy(checkpoint_io=..., async_checkpoint=True).")
        requested = True
    return requested


def _is_lightning(obj: Any, class_name: str, subclasses: bool = True) -> bool:
    """`obj` is Lightning's class of that name (or a subclass), from either Lightning package."""
    classes = type(obj).__mro__ if subclasses else (type(obj),)
    return any(cls.__name__ == class_name and cls.__module__.startswith(_LIGHTNING_PACKAGES) for cls in classes)
