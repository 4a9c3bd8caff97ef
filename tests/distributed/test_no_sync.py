"""no_sync: local accumulation with no communication, then one synced backward averages the sum."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from strategies.buckets import GradBucket
from strategies.comm_hooks import CommHookState, allreduce_mean
from strategies.reducer import GradReducer
from tests.helpers.launch_recorder import LaunchRecorder
from tests.helpers.reducer_models import TinyNet, global_batch, grads_or_zeros, identical_across_ranks, \
    max_abs_diff, shard
from tests.helpers.spawn import run_on_ranks

_LAUNCHES: list[int] = []  # per process: buckets handed to the comm hook


def _counting_hook(state: CommHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    _LAUNCHES.append(bucket.index)
    return allreduce_mean(state, bucket)


def _backward(model: nn.Module, reducer: GradReducer | None, step: int, rank: int, world_size: int) -> None:
    x, y = global_batch(step)
    loss = nn.functional.mse_loss(model(shard(x, rank, world_size)), shard(y, rank, world_size))
    if reducer is not None:
        reducer.prepare_for_backward(loss)
    loss.backward()
    if reducer is not None:
        reducer.finish_backward()


def _flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads_or_zeros(model)])


def _expected_average(plain: nn.Module) -> torch.Tensor:
    """What the synced grads must be: the mean over ranks of each rank's local accumulated sum."""
    expected = _flat_grads(plain)
    dist.all_reduce(expected)
    return expected / dist.get_world_size()


def _accumulate(rank: int, world_size: int, as_view: bool) -> dict[str, Any]:
    model = TinyNet()
    plain = copy.deepcopy(model)  # same micro-batches, never synced: the local accumulated sum
    reducer = GradReducer(model, bucket_cap_mb=0.0001, comm_hook=_counting_hook, gradient_as_bucket_view=as_view)
    facts: dict[str, Any] = {}
    step = 0
    for window in range(2):  # the second window starts from grads that are bucket views (zeroed in place)
        for module in (model, plain):
            module.zero_grad(set_to_none=window == 0)
        with reducer.no_sync():
            for _ in range(2):  # two micro-batches, the inner one under a nested no_sync
                with reducer.no_sync():
                    _backward(model, reducer, step, rank, world_size)
                    _backward(plain, None, step, rank, world_size)
                step += 1
                assert not reducer.require_backward_grad_sync  # the nested exit restored False
        facts[f"launches_inside/{window}"] = len(_LAUNCHES)
        facts[f"identical_inside/{window}"] = identical_across_ranks(_flat_grads(model))
        facts[f"local_sum_inside/{window}"] = max_abs_diff(_flat_grads(model), _flat_grads(plain))
        _backward(model, reducer, step, rank, world_size)
        _backward(plain, None, step, rank, world_size)
        step += 1
        facts[f"identical_after/{window}"] = identical_across_ranks(_flat_grads(model))
        facts[f"vs_expected_after/{window}"] = max_abs_diff(_flat_grads(model), _expected_average(plain))
        _LAUNCHES.clear()
    facts["synced_steps"] = reducer.summary()["synced_steps"]
    return facts


def _accumulate_both_layouts(rank: int, world_size: int) -> dict[bool, dict[str, Any]]:
    return {as_view: _accumulate(rank, world_size, as_view) for as_view in (True, False)}


@pytest.mark.timeout(120)
def test_grads_differ_inside_no_sync_and_match_after_the_synced_step() -> None:
    for per_layout in run_on_ranks(_accumulate_both_layouts, 2):
        for as_view, facts in per_layout.items():
            for window in range(2):
                where = f"gradient_as_bucket_view={as_view}, window {window}: {facts}"
                assert facts[f"launches_inside/{window}"] == 0, where
                assert not facts[f"identical_inside/{window}"], where
                assert facts[f"local_sum_inside/{window}"] == 0.0, where
                assert facts[f"identical_after/{window}"], where
                assert facts[f"vs_expected_after/{window}"] < 1e-6, where
            assert facts["synced_steps"] == 2


def test_no_sync_nests_and_restores_the_previous_value() -> None:
    reducer = GradReducer(TinyNet())
    with reducer.no_sync():
        with reducer.no_sync():
            assert not reducer.require_backward_grad_sync
        assert not reducer.require_backward_grad_sync
    assert reducer.require_backward_grad_sync
    reducer.require_backward_grad_sync = False
    with reducer.no_sync():
        pass
    assert not reducer.require_backward_grad_sync  # restored to False, not forced back to True


def test_no_sync_survives_an_exception() -> None:
    model = TinyNet()
    launches = LaunchRecorder()
    reducer = GradReducer(model, comm_hook=launches)
    with pytest.raises(ZeroDivisionError):
        with reducer.no_sync():
            _backward(model, reducer, 0, 0, 1)
            raise ZeroDivisionError
    assert reducer.require_backward_grad_sync
    assert launches.passes == []  # the backward inside did not sync
    _backward(model, reducer, 1, 0, 1)
    assert len(launches.passes) == 1
