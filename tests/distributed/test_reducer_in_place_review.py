"""Review of #37 (gradients averaged where autograd left them): cases the in-place path must still get right.

Each case runs on two real gloo ranks, compared bit for bit with torch DDP on the same per-rank batches.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from strategies.reducer import GradReducer
from tests.helpers.reducer_models import max_abs_diff, reduced_backward
from tests.helpers.spawn import run_on_ranks

pytestmark = pytest.mark.timeout(120)


class AliasNet(nn.Module):
    """`h + p.view_as(h)`: backward hands the add's gradient to both branches, and the view's backward gives
    `p` a gradient that is a reshape of that very tensor (autograd steals it: one reference to it), so `p.grad`
    shares memory with the gradient the linear layer's backward still has to read."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 8)
        self.p = nn.Parameter(torch.randn(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if h.requires_grad:  # the linear branch runs a little later than p's hook (as a longer branch would)
            h.register_hook(lambda grad: (time.sleep(0.3), grad)[1])
        return h + self.p.view_as(h)


def _alias_case(rank: int, world_size: int) -> float:
    ours, reference = AliasNet(), AliasNet()
    reducer = GradReducer(ours, bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)  # one parameter per bucket
    ddp = DistributedDataParallel(reference)
    worst = 0.0
    for step in range(2):
        generator = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(4, 8, generator=generator)
        for model in (ours, reference):
            model.zero_grad()
        loss = (ours(x) ** 2).sum()
        reduced_backward(reducer, loss)
        (ddp(x) ** 2).sum().backward()
        worst = max(worst, max_abs_diff([p.grad for p in ours.parameters()], [p.grad for p in reference.parameters()]))
    reducer.remove()
    return worst


def test_a_gradient_sharing_memory_with_one_backward_still_reads_is_not_written_during_backward() -> None:
    assert run_on_ranks(_alias_case, 2) == [0.0, 0.0]


def _tiny_fp16_case(rank: int, world_size: int, reducer_options: dict[str, Any]) -> float:
    """Gradients around 1e-5, where fp16 is subnormal: torch's hook rounds to fp16 first, then divides in fp16
    (a second rounding there); dividing first and rounding once gives other bits for about a quarter of them."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(0)
    ours = nn.Linear(64, 64)
    reference = copy.deepcopy(ours)
    reducer = GradReducer(ours, comm_hook="fp16", **reducer_options)
    ddp = DistributedDataParallel(reference)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(8, 64, generator=generator)
    loss = ours(x).square().mean() * 1e-4
    reduced_backward(reducer, loss)
    (ddp(x).square().mean() * 1e-4).backward()
    worst = max_abs_diff([p.grad for p in ours.parameters()], [p.grad for p in reference.parameters()])
    reducer.remove()
    return worst


@pytest.mark.parametrize("reducer_options", [{}, {"transport": "process_group"}], ids=["shared_memory", "gloo"])
def test_the_fp16_hook_matches_torchs_bits_on_subnormal_gradients(reducer_options: dict[str, Any]) -> None:
    assert run_on_ranks(_tiny_fp16_case, 2, reducer_options) == [0.0, 0.0]


class MixedNet(nn.Module):
    """fp32 and fp64 parameters (a bucket each), an empty parameter, and two gradients that are disjoint views
    of one tensor (the backward of a `cat` of parameters hands each its slice)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.rand(8, dtype=torch.float64) + 0.5)
        self.empty = nn.Parameter(torch.zeros(0))
        self.left, self.right = nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (self.linear(x).double() * self.scale).float()
        return h * torch.cat([self.left, self.right]) + self.empty.sum()


def _mixed_case(rank: int, world_size: int, as_view: bool, set_to_none: bool) -> float:
    ours, reference = MixedNet(), MixedNet()
    reducer = GradReducer(ours, gradient_as_bucket_view=as_view, bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)
    ddp = DistributedDataParallel(reference, gradient_as_bucket_view=as_view)
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) for model in (ours, ddp)]
    worst = 0.0
    for step in range(4):  # the buckets are rebuilt after the first
        generator = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(4, 8, generator=generator)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)
        for micro in range(2):  # the first accumulates locally
            context = reducer.no_sync() if micro == 0 else contextlib.nullcontext()
            with context:
                loss = (ours(x + micro) ** 2).mean()
                reduced_backward(reducer, loss)
            with ddp.no_sync() if micro == 0 else contextlib.nullcontext():
                (ddp(x + micro) ** 2).mean().backward()
        worst = max(worst, max_abs_diff([p.grad for p in ours.parameters()], [p.grad for p in ddp.parameters()]))
        for optimizer in optimizers:
            optimizer.step()
    worst = max(worst, max_abs_diff(list(ours.parameters()), list(reference.parameters())))
    reducer.remove()
    return worst


@pytest.mark.parametrize("as_view", [True, False])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_mixed_dtypes_empty_and_sliced_gradients_match_torch_ddp(as_view: bool, set_to_none: bool) -> None:
    assert run_on_ranks(_mixed_case, 2, as_view, set_to_none) == [0.0, 0.0]
