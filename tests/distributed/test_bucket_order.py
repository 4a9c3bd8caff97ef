"""Bucket launch order is the same on every rank, and buckets are rebuilt exactly once, from rank 0's order."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from strategies.reducer import GradReducer
from tests.helpers.launch_recorder import LaunchRecorder
from tests.helpers.reducer_models import BranchNet, flat_params, global_batch, identical_across_ranks, shard
from tests.helpers.spawn import run_on_ranks

STEPS = 4


def _count_broadcasts() -> list[int]:
    """Wrap dist.broadcast_object_list (the rebuild's only collective besides the buckets) to count calls."""
    calls: list[int] = []
    original = dist.broadcast_object_list

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    dist.broadcast_object_list = counting  # type: ignore[assignment]  # this spawned process only
    return calls


def _readiness_recorder(model: nn.Module) -> list[str]:
    ready: list[str] = []
    for name, param in model.named_parameters():
        param.register_post_accumulate_grad_hook(lambda _, name=name: ready.append(name))
    return ready


def _train_branches(rank: int, world_size: int) -> dict[str, Any]:
    broadcasts = _count_broadcasts()
    model = BranchNet()
    ready = _readiness_recorder(model)
    launches = LaunchRecorder()
    reducer = GradReducer(model, bucket_cap_mb=0.0001, comm_hook=launches)  # about one bucket per parameter
    broadcasts.clear()  # setting up the shared-memory transport broadcasts its file name
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plans = [reducer.summary()["bucket_param_indices"]]
    for step in range(STEPS):
        x, y = global_batch(step)
        optimizer.zero_grad()
        out = model(shard(x, rank, world_size), a_first=rank != 0)  # rank 0 runs branch b first
        loss = nn.functional.mse_loss(out, shard(y, rank, world_size))
        reducer.prepare_for_backward(out)
        loss.backward()
        reducer.finish_backward()
        optimizer.step()
        plans.append(reducer.summary()["bucket_param_indices"])
        if step == 0:
            first_ready = list(ready)
    return {
        "names": [name for name, _ in model.named_parameters()],
        "ready_order": first_ready,
        "plans": plans,
        "launch_orders": launches.passes,
        "broadcasts": len(broadcasts),
        "summary": reducer.summary(),
        "params_identical": identical_across_ranks(flat_params(model)),
    }


@pytest.mark.timeout(120)
def test_launch_order_matches_and_rebuild_happens_once_from_rank_zero() -> None:
    rank0, rank1 = run_on_ranks(_train_branches, 2)
    names = rank0["names"]
    assert rank0["ready_order"] != rank1["ready_order"], "precondition: ranks must see different readiness orders"

    # Every rank launched every bucket, in index order, every step.
    assert rank0["launch_orders"] == rank1["launch_orders"]
    assert len(rank0["launch_orders"]) == STEPS
    assert all(order == list(range(rank0["summary"]["buckets"])) for order in rank0["launch_orders"])

    # Initial plan: reverse registration order. After step 1: rank 0's observed order, on both ranks.
    initial = [i for bucket in rank0["plans"][0] for i in bucket]
    assert initial == list(reversed(range(len(names))))
    for result in (rank0, rank1):
        rebuilt = [names[i] for bucket in result["plans"][1] for i in bucket]
        assert rebuilt == rank0["ready_order"]
        assert all(plan == result["plans"][1] for plan in result["plans"][1:]), "rebuilt more than once"
        assert result["broadcasts"] == 1 and result["summary"]["rebuilt"]
        assert result["params_identical"]

    summary = rank0["summary"]
    assert summary["synced_steps"] == STEPS
    assert summary["exposed_comm_s_last"] >= 0.0 and summary["comm_s_total"] > 0.0
    assert len(summary["bucket_sizes_mib"]) == summary["buckets"]
