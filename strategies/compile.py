"""Compiled modules under DDP: keep communication overlapped with backward.

AOTAutograd turns a compiled graph's backward into one autograd node, so every parameter's
gradient becomes ready at once, when the whole backward has finished, and every bucket would
wait for the end. torch DDP keeps the overlap by splitting the graph at its bucket boundaries
(dynamo's `DDPOptimizer`): each piece gets its own backward node, and the gradients of the last
layers are ready, and their buckets launched, while earlier pieces still run backward. We reuse
that splitter with our bucket sizes, around the backend (and so the arguments) the user compiled
with. Our reducer still launches buckets strictly in its own order, so the split decides only how
early gradients become ready, never which collective runs when.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_MIB = 1024 * 1024
# What Lightning compiles of a compiled LightningModule (and so do we): its forward and its steps.
COMPILED_METHODS = ("forward", "training_step", "validation_step", "test_step", "predict_step")


def bucketed_context(dynamo_ctx: Any, bucket_cap_mb: float, first_bucket_cap_mb: float) -> Callable[[Any], Any]:
    """A context like `dynamo_ctx` (same backend, `fullgraph`, `dynamic`) whose graphs are split
    into pieces of about `bucket_cap_mb` of parameters (the last piece `first_bucket_cap_mb`)."""
    from torch._dynamo.backends.distributed import DDPOptimizer

    backend = _user_backend(dynamo_ctx)
    if backend is None:  # a dynamo without this (private) layout: compile as the user asked, unsplit
        return dynamo_ctx  # type: ignore[no-any-return]
    splitter = DDPOptimizer(bucket_bytes_cap=int(bucket_cap_mb * _MIB), backend_compile_fn=backend,
                            first_bucket_cap=int(first_bucket_cap_mb * _MIB))
    fullgraph = bool(getattr(dynamo_ctx, "fullgraph", False))
    dynamic = getattr(dynamo_ctx, "_dynamic", None)

    def compile_split(fn: Any) -> Any:
        return torch.compile(fn, backend=splitter.compile_fn, fullgraph=fullgraph, dynamic=dynamic)

    return compile_split


def _user_backend(dynamo_ctx: Any) -> Callable[..., Any] | None:
    """The compiler the user chose (inductor with its mode and options, "aot_eager", a function),
    found under dynamo's frame-conversion wrappers, each of which keeps the one it wraps."""
    backend: Any = None
    inner: Any = getattr(dynamo_ctx, "callback", None)
    while hasattr(inner, "_torchdynamo_orig_backend"):
        backend = inner = inner._torchdynamo_orig_backend
    return backend if callable(backend) else None


def split_lightning_compiled(module: Any, bucket_cap_mb: float, first_bucket_cap_mb: float) -> None:
    """A module Lightning's Trainer compiled (its `from_compiled` keeps the dynamo context and the
    original methods in `module._compiler_ctx`): compile its forward and steps again through the
    bucket-splitting context, so our reducer overlaps inside Lightning's Trainer too."""
    context = getattr(module, "_compiler_ctx", None)
    if not isinstance(context, dict) or context.get("dynamo_ctx") is None:
        return
    split = bucketed_context(context["dynamo_ctx"], bucket_cap_mb, first_bucket_cap_mb)
    for name in COMPILED_METHODS:
        original = context.get(f"original_{name}")
        if original is not None:
            setattr(module, name, split(original))
