"""Comm hooks: name resolution, the world-size-1 shortcut, and real averaging on two gloo ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from strategies.buckets import GradBucket
from strategies.comm_hooks import COMM_HOOKS, CommHookState, allreduce_mean, bf16_compress, fp16_compress, \
    resolve_comm_hook
from tests.helpers.spawn import run_on_ranks


def test_resolve_by_name_default_and_callable() -> None:
    assert resolve_comm_hook(None) is allreduce_mean
    assert resolve_comm_hook("mean") is allreduce_mean
    assert resolve_comm_hook("fp16") is fp16_compress
    assert resolve_comm_hook("bf16") is bf16_compress
    assert resolve_comm_hook(fp16_compress) is fp16_compress
    assert sorted(COMM_HOOKS) == ["bf16", "fp16", "mean"]


def test_unknown_name_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"'fp8'.*\['bf16', 'fp16', 'mean'\]"):
        resolve_comm_hook("fp8")
    with pytest.raises(TypeError, match="int"):
        resolve_comm_hook(8)  # type: ignore[arg-type]


@pytest.mark.parametrize("hook", [allreduce_mean, fp16_compress, bf16_compress])
def test_world_size_one_returns_the_buffer_untouched(hook: Any) -> None:
    """No process group needed: averaging over one rank is the identity, so nothing is sent."""
    bucket = GradBucket(0, [torch.tensor([1.0, 1e-4, 3.0])])
    before = bucket.buffer().clone()
    result = hook(CommHookState(None, 1), bucket).wait()
    assert result.data_ptr() == bucket.buffer().data_ptr()
    assert torch.equal(bucket.buffer(), before)


def _average_with_every_hook(rank: int, world_size: int) -> dict[str, Any]:
    state = CommHookState(None, world_size)
    results = {}
    for name, hook in COMM_HOOKS.items():
        for dtype in (torch.float32, torch.float64):
            grad = torch.arange(1.0, 5.0, dtype=dtype) * (rank + 1)
            bucket = GradBucket(0, [grad])
            bucket.buffer().copy_(grad)
            result = hook(state, bucket).wait()
            results[f"{name}/{dtype}"] = {
                "result_is_buffer": result.data_ptr() == bucket.buffer().data_ptr(),
                "buffer": bucket.buffer().clone(),
            }
    return results


@pytest.mark.timeout(120)
def test_hooks_average_over_two_ranks() -> None:
    per_rank = run_on_ranks(_average_with_every_hook, 2)
    expected = torch.arange(1.0, 5.0) * 1.5  # mean of 1x and 2x; exactly representable in fp16/bf16
    for rank, results in enumerate(per_rank):
        for key, result in results.items():
            assert result["result_is_buffer"], f"{key} on rank {rank} must answer with the bucket buffer"
            buffer = result["buffer"]
            assert buffer.dtype == (torch.float64 if "float64" in key else torch.float32), key
            assert torch.equal(buffer, expected.to(buffer.dtype)), f"{key} on rank {rank}: {buffer}"
