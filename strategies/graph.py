"""Which parameters a backward pass can reach: `find_unused_parameters` support for the reducer.

A parameter the outputs do not depend on gets no gradient this pass; the reducer marks it ready
up front so its bucket does not wait for a hook that will never fire.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.hang_guard import LEDGER


def reachable_parameter_ids(outputs: Any) -> set[int]:
    """ids of the leaf tensors whose AccumulateGrad nodes are reachable from `outputs`' graph."""
    stack: list[Any] = []
    reachable: set[int] = set()
    for tensor in tensors_in(outputs):
        if tensor.grad_fn is not None:
            stack.append(tensor.grad_fn)
        elif tensor.requires_grad:
            reachable.add(id(tensor))  # an output that is itself a leaf parameter
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # only AccumulateGrad nodes have one
        if variable is not None:
            reachable.add(id(variable))
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return reachable


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors_in(value)


def launch_used_map(params: list[nn.Parameter], group: dist.ProcessGroup | None,
                    world_size: int) -> torch.futures.Future[list[torch.Tensor]] | None:
    """Sum "has a gradient" over ranks, so a param unused everywhere keeps `.grad` untouched.

    The reducer issues it after every bucket on every rank, so the collective order still matches.
    """
    device = params[0].device if params else torch.device("cpu")
    used = torch.tensor([param.grad is not None for param in params], dtype=torch.int32, device=device)
    if world_size == 1:
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        future.set_result([used.cpu()])
        return future
    LEDGER.begin("all_reduce(unused-parameter map)", used)
    work = dist.all_reduce(used, group=group, async_op=True)
    return None if work is None else work.get_future().then(lambda fut: [fut.value()[0].cpu()])
