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


def test_parameters_move_into_their_buckets_flat_buffer_with_values_and_hooks_kept() -> None:
    """The gather is in place because each bucket's parameters live in one flat buffer laid out as the bucket:
    the same Parameter objects, same values, their gradient hooks (the reducer's) still firing."""
    params = _params()
    before = [param.detach().clone() for param in params]
    fired: list[int] = []
    for index, param in enumerate(params):
        param.register_post_accumulate_grad_hook(lambda _p, index=index: fired.append(index))
    layout = BucketLayout(params, plan_buckets(params, bucket_cap_mb=0.0004, first_bucket_cap_mb=0.0002), pad_to=3)
    shards = ZeroShards(params, layout, rank=1, world_size=3)
    for indexes, flat in zip(layout.plan, shards.param_buffers):
        offset = 0
        for index in indexes:
            assert params[index].data_ptr() == flat[offset:].data_ptr()
            assert torch.equal(params[index], before[index])
            offset += params[index].numel()
        assert flat.numel() % 3 == 0 and bool((flat[offset:] == 0).all())  # the padding
    sum(param.sum() for param in params).backward()
    assert sorted(fired) == list(range(len(params)))
    assert all(torch.equal(param.grad, torch.ones_like(param)) for param in params)


def test_a_non_contiguous_parameter_is_refused_by_index_and_shape() -> None:
    params = [torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(6, 4).t())]
    layout = BucketLayout(params, [[0, 1]], pad_to=2)
    with pytest.raises(ValueError, match=r"parameter 1 of shape \(4, 6\) is not"):
        ZeroShards(params, layout, rank=0, world_size=2)


def test_parameters_given_new_storage_after_setup_are_refused_before_the_gather() -> None:
    params = _params()
    layout = BucketLayout(params, [list(range(len(params)))], pad_to=1)
    shards = ZeroShards(params, layout, rank=0, world_size=1)
    params[0].data = params[0].detach().double()  # what a module.double() during fit does to every parameter
    with pytest.raises(RuntimeError, match="bucket 0 no longer live in the buffer"):
        shards.gather([0])
