"""ZeRO-1's shard layout (strategies/zero.py) without a process group: every element of every bucket is
stepped by exactly one rank, shards are even, and a parameter's state cut into segments joins back whole."""

from __future__ import annotations

import pytest
import torch

from strategies.buckets import BucketLayout, plan_buckets
from strategies.zero import ZeroShards, _join, check_elementwise


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape)) for shape in ((7, 13), (13,), (11, 13), (11,), (1, 11), (1,))]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_every_element_is_stepped_by_exactly_one_rank_in_even_shards(world_size: int) -> None:
    params = _params()
    layout = BucketLayout(params, plan_buckets(params, bucket_cap_mb=0.0004, first_bucket_cap_mb=0.0002),
                          pad_to=world_size)
    assert len(layout.buckets) >= 2
    covered = [torch.zeros(p.numel(), dtype=torch.int64) for p in params]
    for rank in range(world_size):
        shards = ZeroShards(params, layout, rank, world_size)
        for bucket, size in zip(layout.buckets, shards.shard_numel):
            assert bucket.buffer().numel() == size * world_size  # padded to whole, even shards
        for index, segment in shards.segments.items():
            covered[index][segment.start:segment.start + segment.length] += 1
            tensor = shards.tensors[index]  # a view of the parameter's own elements
            assert tensor.data_ptr() == params[index].view(-1)[segment.start:].data_ptr()
            assert torch.equal(tensor, params[index].detach().view(-1)[segment.start:segment.start + segment.length])
    assert all(bool((count == 1).all()) for count in covered)


def test_a_state_cut_into_segments_joins_back_whole() -> None:
    shape = torch.Size((11, 13))
    moments = torch.randn(shape)
    cuts = [(0, 50), (50, 100), (100, 143)]
    parts = [(low, {"exp_avg": moments.reshape(-1)[low:high].clone(), "step": torch.tensor(3.0)})
             for low, high in cuts]
    joined = _join(sorted(parts, key=lambda part: part[0]), shape)
    assert torch.equal(joined["exp_avg"], moments) and torch.equal(joined["step"], torch.tensor(3.0))


def test_only_elementwise_optimizers_are_sharded() -> None:
    weight = torch.nn.Parameter(torch.randn(3))
    for optimizer in (torch.optim.SGD([weight], lr=0.1), torch.optim.AdamW([weight]), torch.optim.RAdam([weight])):
        check_elementwise(optimizer)
    with pytest.raises(TypeError, match="LBFGS"):
        check_elementwise(torch.optim.LBFGS([weight]))

    class Mine(torch.optim.SGD):
        zero_shardable = True

    check_elementwise(Mine([weight], lr=0.1))
    with pytest.raises(TypeError, match="zero_shardable"):
        check_elementwise(type("Other", (torch.optim.SGD,), {})([weight], lr=0.1))
