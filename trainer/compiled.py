"""What a `torch.compile`d module means to the Trainer (Lightning's semantics).

`trainer.fit(torch.compile(model))` hands over a `torch._dynamo.OptimizedModule` wrapping the
LightningModule. As in Lightning, the Trainer runs the module itself with its `forward` and its
`*_step` methods compiled under the same dynamo context (so the `torch.compile` arguments hold),
and everything else (hooks, checkpoints, `trainer.lightning_module`) sees the plain module. The
context travels to the workers with the module (it pickles; its backend holds the compile
arguments); each stage compiles there through `strategy.compile_context`, which lets DDP split
graphs at its bucket boundaries, and puts the plain methods back when the stage ends.

A module may also compile parts of itself (`self.encoder = torch.compile(self.encoder)`, e.g. in
`configure_model`): its state dict then names `encoder._orig_mod.weight`. Checkpoints hold plain
names (`encoder.weight`), loadable into a compiled or an uncompiled module alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch import nn

from strategies.base import Strategy
from strategies.compile import COMPILED_METHODS
_CONTEXT_ATTRIBUTE = "_ddp_trainer_dynamo_ctx"  # set on the plain module; it pickles with it
_WRAPPER_PREFIX = "_orig_mod."


def is_compiled(model: Any) -> bool:
    """Whether `model` is what `torch.compile(module)` returns (without importing dynamo first)."""
    return type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module)


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module inside `torch.compile(module)`, remembering how it was compiled; others as they are."""
    if not is_compiled(model):
        return model
    module: nn.Module = model._orig_mod  # type: ignore[assignment]
    setattr(module, _CONTEXT_ATTRIBUTE, model.dynamo_ctx)
    return module


@contextmanager
def compiled_steps(module: nn.Module, strategy: Strategy) -> Iterator[None]:
    """Run `forward` and the steps of a module given compiled through its dynamo context (adapted
    by the strategy) for the duration of a stage; put the plain methods back afterwards."""
    context = module.__dict__.get(_CONTEXT_ATTRIBUTE)
    if context is None:
        yield
        return
    context = strategy.compile_context(context)
    replaced = [name for name in COMPILED_METHODS if callable(getattr(module, name, None))]
    for name in replaced:
        setattr(module, name, context(getattr(module, name)))
    try:
        yield
    finally:
        for name in replaced:
            module.__dict__.pop(name, None)


def plain_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """`state` with the `_orig_mod.` segments of compiled submodules removed from its keys."""
    return {_plain_key(key): value for key, value in state.items()}


def state_dict_for(module: nn.Module, state: Mapping[str, Any]) -> Mapping[str, Any]:
    """`state` (plain names, or a compiled module's) renamed to the keys `module` uses."""
    ours = {_plain_key(key): key for key in module.state_dict()}
    if all(ours[plain] == plain for plain in ours):
        return plain_state_dict(state) if any(_WRAPPER_PREFIX in key for key in state) else state
    return {ours.get(_plain_key(key), key): value for key, value in state.items()}


def _plain_key(key: str) -> str:
    return key.replace(_WRAPPER_PREFIX, "")
