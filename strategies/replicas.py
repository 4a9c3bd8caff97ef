"""Every rank starts from the same model: the same parameter layout (checked, so mismatched models fail
with a message instead of a hang) and rank 0's values (broadcast). Used by our DDPStrategy and by the
Lightning plug-in's wrapper."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.hang_guard import LEDGER
from strategies.rank_zero import rank_prefixed_message


def check_same_parameters(module: nn.Module, rank: int) -> None:
    """Every rank must hold the same parameter names and shapes, or the buckets would not line
    up and the first all-reduce would hang or mix unrelated gradients. Raises on every rank."""
    mine = [(name, tuple(param.shape), str(param.dtype)) for name, param in module.named_parameters()]
    everyone: list[Any] = [None] * dist.get_world_size()
    with LEDGER.collective("all_gather(parameter names and shapes)"):
        dist.all_gather_object(everyone, mine)
    reference = everyone[0]
    for other_rank, theirs in enumerate(everyone[1:], start=1):
        if theirs == reference:
            continue
        for position in range(max(len(reference), len(theirs))):
            ours = reference[position] if position < len(reference) else None
            other = theirs[position] if position < len(theirs) else None
            if ours != other:
                raise RuntimeError(rank_prefixed_message(
                    f"parameters differ between ranks 0 and {other_rank}: parameter #{position} is {ours} "
                    f"on rank 0 but {other} on rank {other_rank} (name, shape, dtype). Every rank must build "
                    f"the same model.", rank))


@torch.no_grad()
def broadcast_tensors(tensors: list[torch.Tensor]) -> None:
    """Copy rank 0's values into `tensors`, one flat collective per (device, dtype) group."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    for group in groups.values():
        flat = torch.cat([tensor.detach().reshape(-1) for tensor in group])
        with LEDGER.collective("broadcast(parameters/buffers from rank 0)", flat):
            dist.broadcast(flat, src=0)
        offset = 0
        for tensor in group:
            tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
