"""`ShardedGradReducer` at stage 2 (strategies/zero_reducer.py) on 2 real ranks, without the Trainer.

After one synchronised backward each rank's shard of the averaged gradients must hold exactly the bits of
that part of a plain all-reduce's average; every bucket's memory must be released again and no `.grad`
left pointing into it; and a parameter no rank used must still be told apart from the used ones when
the unused-parameter map is read after the buckets were released (the end-of-backward waits here until
every reduce-scatter is done, so the map is read after the releases).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from strategies.reducer_options import ReducerOptions
from strategies.zero import attach_shards, shard_optimizers
from tests.helpers.spawn import run_on_ranks

pytestmark = [pytest.mark.timeout(120), pytest.mark.conformance]  # ~10 s of process start-up


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(7, 13), nn.Linear(13, 3)
        self.unused = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


def _one_pass(rank: int, world_size: int, transport: str) -> dict[str, Any]:
    net, reference = _Net(), _Net()
    options = ReducerOptions(bucket_cap_mb=0.0003, first_bucket_cap_mb=0.0001, find_unused_parameters=True,
                             transport=transport, zero_stage=2)
    reducer, _ = options.attach(net, timeout=timedelta(seconds=60))
    shards = attach_shards(reducer, rank, world_size)
    assert shards is not None
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    shard_optimizers([optimizer], shards, loss_scaling=False)
    finalize = reducer._finalize

    def late_finalize() -> None:  # every reduce-scatter (and release) is done before the map is read
        time.sleep(0.5)
        finalize()

    reducer._finalize = late_finalize  # type: ignore[method-assign]
    x = torch.randn(8, 7, generator=torch.Generator().manual_seed(rank))
    out = net(x)
    reducer.prepare_for_backward(out)
    out.square().mean().backward()
    reducer.finish_backward()
    # The same gradients, averaged by a plain all-reduce
    reference(x).square().mean().backward()
    expected = {}
    for name, param in reference.named_parameters():
        if param.grad is not None:
            grad = param.grad / world_size
            dist.all_reduce(grad)
            expected[name] = grad
    names = {id(param): name for name, param in net.named_parameters()}
    exact, bound = True, {}
    for index, segment in shards.segments.items():
        name = names[id(shards.params[index])]
        got = shards.tensors[index].grad
        bound[name] = got is not None
        if got is not None:
            want = expected[name].reshape(-1)[segment.start:segment.start + segment.length]
            exact &= torch.equal(got, want)
    gradient_bytes = reducer.gradient_bytes()
    return {"exact": exact, "bound": bound, "grads_none": all(p.grad is None for p in net.parameters()),
            "released": gradient_bytes["held"] == gradient_bytes["shards"]}


@pytest.mark.parametrize("transport", ["shared_memory", "process_group"])
def test_each_rank_keeps_exactly_its_shard_and_unused_parameters_stay_unbound(transport: str) -> None:
    results = run_on_ranks(_one_pass, 2, transport)
    for rank, result in enumerate(results):
        assert result["exact"], f"rank {rank}: its shard differs from the all-reduce's average"
        assert result["grads_none"] and result["released"], result
        assert result["bound"].get("unused") in (None, False), result  # no rank used it: the optimizer skips it
        assert any(result["bound"].values()), result
    assert {name for result in results for name, bound in result["bound"].items() if bound} == {
        "first.weight", "first.bias", "second.weight", "second.bias"}
