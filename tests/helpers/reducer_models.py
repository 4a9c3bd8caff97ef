"""Tiny deterministic models, data and comparison helpers shared by the reducer tests.

Models are small on purpose (spawned ranks share two cores with other test runs) but have
several layers, so even modest bucket caps produce more than one bucket.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

IN_FEATURES, HIDDEN, OUT_FEATURES = 8, 16, 4


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


class TinyNet(nn.Module):
    """Three linear layers; every parameter is used in every forward."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        _seeded(seed)
        self.body = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                                  nn.Linear(HIDDEN, OUT_FEATURES))

    def forward(self, x: torch.Tensor, use_extra: bool = True) -> torch.Tensor:
        return self.body(x)


class ExtraParamNet(nn.Module):
    """`unused` never takes part in forward; `extra` only when `use_extra` (may differ per rank)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        _seeded(seed)
        self.body = TinyNet(seed).body
        self.extra = nn.Linear(OUT_FEATURES, OUT_FEATURES)
        self.unused = nn.Linear(OUT_FEATURES, OUT_FEATURES)

    def forward(self, x: torch.Tensor, use_extra: bool = True) -> torch.Tensor:
        y = self.body(x)
        return self.extra(y) + y if use_extra else y


class BranchNet(nn.Module):
    """Two parallel branches; `a_first` picks which one forward computes first.

    Autograd runs the most recently created nodes first, so flipping `a_first` flips the order
    in which the branches' gradients become ready: a way to give ranks different readiness orders.
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        _seeded(seed)
        self.a = nn.Linear(IN_FEATURES, OUT_FEATURES)
        self.b = nn.Linear(IN_FEATURES, OUT_FEATURES)
        self.head = nn.Linear(OUT_FEATURES, OUT_FEATURES)

    def forward(self, x: torch.Tensor, a_first: bool = True) -> torch.Tensor:
        if a_first:
            ya = self.a(x)
            yb = self.b(x)
        else:
            yb = self.b(x)
            ya = self.a(x)
        return self.head(torch.tanh(ya) * torch.tanh(yb))


MODELS: dict[str, type[nn.Module]] = {"tiny": TinyNet, "extra": ExtraParamNet, "branch": BranchNet}


def global_batch(step: int, size: int = 16, seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole (global) batch; rank r trains on `shard(tensor, r, world_size)`."""
    generator = torch.Generator().manual_seed(seed + step)
    x = torch.randn(size, IN_FEATURES, generator=generator)
    y = torch.randn(size, OUT_FEATURES, generator=generator)
    return x, y


def shard(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    return tensor.chunk(world_size)[rank]


def flat_params(module: nn.Module) -> torch.Tensor:
    return torch.cat([param.detach().reshape(-1) for param in module.parameters()])


def grads_or_zeros(module: nn.Module) -> list[torch.Tensor]:
    """Gradients with None read as zeros (torch DDP leaves unused ones None)."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in module.parameters()]


def reduced_backward(reducer: Any, loss: torch.Tensor) -> None:
    """`loss.backward()` under a GradReducer's contract: `prepare_for_backward` before, `finish_backward` after."""
    reducer.prepare_for_backward(loss)
    loss.backward()
    reducer.finish_backward()


def max_abs_diff(left: list[torch.Tensor] | torch.Tensor, right: list[torch.Tensor] | torch.Tensor) -> float:
    if isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor):
        return float((left.float() - right.float()).abs().max()) if left.numel() else 0.0
    return max((max_abs_diff(a, b) for a, b in zip(left, right)), default=0.0)


def identical_across_ranks(tensor: torch.Tensor) -> bool:
    """Whether every rank holds bit-for-bit the same tensor (a collective: call on all ranks)."""
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return all(torch.equal(gathered[0], other) for other in gathered[1:])
