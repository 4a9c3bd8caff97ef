"""ZeRO-1's shard layout (strategies/zero.py) without a process group: every element of every bucket is
stepped by exactly one rank, shards are even, and a parameter's state cut into segments joins back whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from strategies.buckets import BucketLayout, plan_buckets
from strategies.zero import ZeroShards, _join, check_elementwise
from tests.helpers.spawn import free_port


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


def test_a_parameter_given_new_storage_after_setup_is_refused_before_the_gather() -> None:
    params = _params()
    layout = BucketLayout(params, [list(range(len(params)))], pad_to=1)
    shards = ZeroShards(params, layout, rank=0, world_size=1)
    params[3].data = params[3].detach().clone()  # one parameter's .data replaced (a pruning callback's reset)
    with pytest.raises(RuntimeError, match=r"parameter 3 \(bucket 0, shape \(11,\)\) no longer lives in the buffer"):
        shards.gather([0])


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A real process group of one gloo rank in this process, for the gather's own code path."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_gather_bumps_every_parameters_version_and_the_stage_end_gives_them_their_storage_back(
        one_rank_group: None) -> None:
    """Written through the flat buffers, the gather bumps each parameter's own version counter (autograd then
    refuses a graph saved before the step, as at zero_stage=0); at the stage's end every parameter gets its own
    storage again, values kept, and the optimizer's slices follow it."""
    params = _params()
    layout = BucketLayout(params, plan_buckets(params, bucket_cap_mb=0.0004, first_bucket_cap_mb=0.0002), pad_to=1)
    shards = ZeroShards(params, layout, rank=0, world_size=1)
    saved = params[0] * params[0]  # a graph that saved params[0]
    before = [param._version for param in params]
    shards.gather(list(range(len(layout.buckets))))
    assert all(param._version > version for param, version in zip(params, before))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()
    values = [param.detach().clone() for param in params]
    shards.release_parameters()
    assert shards.param_buffers == []
    for index, param in enumerate(params):
        assert torch.equal(param, values[index])
        assert param.untyped_storage().nbytes() == param.numel() * param.element_size()  # its own storage
        segment = shards.segments[index]
        assert shards.tensors[index].data_ptr() == param.view(-1)[segment.start:].data_ptr()
