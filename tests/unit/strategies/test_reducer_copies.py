"""How fresh gradients reach their bucket slots, per device kind (`strategies.buckets.copies_per_bucket`).

On an accelerator every op is a kernel launch the host pays for, so a bucket's gradients go in with one
foreach op when the bucket completes (#30). On a CPU an op costs its pass over memory, so each gradient
goes in as it arrives, divided on the way when prescaled: one pass, no temporary bucket (#37).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from strategies import buckets
from strategies.reducer import GradReducer

_WRITES = ("copy", "div")


class _GradientWrites(TorchDispatchMode):
    """Counts the ops that write gradients into slots, and the tensors they allocate on the way."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._overloadpacket.__name__
        if any(word in name for word in _WRITES):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])  # 12 parameter tensors


def _run_steps(reducer: GradReducer, model: torch.nn.Module, divisor: int) -> list[Counter[str]]:
    return _run_steps_on(reducer, model, divisor, device="cpu")


def _run_steps_on(reducer: GradReducer, model: torch.nn.Module, divisor: int, device: str) -> list[Counter[str]]:
    """Three steps (one when prescaled); each checks every `.grad` is its slot holding the local gradient
    divided by `divisor`."""
    counts = []
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        inputs = torch.randn(4, 8, device=device)
        expected = torch.autograd.grad(model(inputs).sum(), list(model.parameters()))
        mode = _GradientWrites()
        with mode:
            reducer.prepare_for_backward(None)
            model(inputs).sum().backward()
            reducer.finish_backward()
        counts.append(mode.ops)
        for param, grad, view in zip(model.parameters(), expected, reducer._layout.views):
            assert torch.equal(param.grad, grad / divisor) and param.grad is view
        if divisor != 1:  # one step: the test stands in for the collective, which would average the slots
            return counts
    return counts


def _as_received(state: Any, bucket: buckets.GradBucket) -> torch.futures.Future[torch.Tensor]:
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _as_prescaled_ranks(reducer: GradReducer, world_size: int) -> None:
    """Make a one-process reducer divide as one of `world_size` prescaled ranks would; its hook hands each
    bucket back as the collective would receive it."""
    reducer._state = reducer._state.__class__(None, world_size, None, prescaled=True)
    reducer.world_size = reducer._divisor = world_size
    reducer._hook = _as_received


def test_on_an_accelerator_one_foreach_copy_per_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buckets, "copies_per_bucket", lambda device: True)  # the policy a GPU gets
    model = _model()
    reducer = GradReducer(model, bucket_cap_mb=0.0006, first_bucket_cap_mb=0.0003)  # a few small buckets
    counts = _run_steps(reducer, model, divisor=1)
    count = reducer.summary()["buckets"]
    assert 1 < count < 12
    for step in (1, 2):  # step 0 also moves every gradient into the rebuilt buckets
        assert set(counts[step]) <= {"_foreach_copy_", "copy_"}, counts[step]  # a one-gradient bucket: copy_
        assert sum(counts[step].values()) == count, counts[step]  # one launch per bucket
    reducer.remove()


def test_on_a_cpu_each_gradient_goes_in_as_it_arrives_in_one_pass() -> None:
    model = _model()
    reducer = GradReducer(model, bucket_cap_mb=0.0006, first_bucket_cap_mb=0.0003)
    assert reducer._layout.batched_copies == [False] * len(reducer._layout.buckets)
    counts = _run_steps(reducer, model, divisor=1)
    assert counts[1] == counts[2] == {"copy_": 12}  # one copy per gradient, no foreach batch
    reducer.remove()


def test_prescaled_gradients_are_divided_into_their_slots_without_a_temporary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A prescaled reducer divides each gradient straight into its slot (`div` with `out=`): one op per
    gradient on a CPU, and on an accelerator one copy plus one in-place divide per bucket, never an
    out-of-place foreach divide that allocates a bucket of temporaries."""
    for batched in (False, True):
        monkeypatch.setattr(buckets, "copies_per_bucket", lambda device, batched=batched: batched)
        model = _model()
        reducer = GradReducer(model, bucket_cap_mb=0.0006, first_bucket_cap_mb=0.0003)
        _as_prescaled_ranks(reducer, 4)
        count = len(reducer._layout.buckets)
        ops = _run_steps(reducer, model, divisor=4)[0]
        if batched:  # per bucket: one copy and one in-place divide (a one-gradient bucket: one `div` into it)
            assert ops["_foreach_copy_"] == ops["_foreach_div_"] and ops["_foreach_copy_"] + ops["div"] == count, ops
        else:
            assert ops["div"] == 12 and ops["_foreach_copy_"] == 0, ops
        assert "_foreach_div" not in ops, ops  # never an out-of-place divide into temporaries


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_real_policy_copies_a_bucket_at_once_and_divides_in_place() -> None:
    """Not a stand-in policy: the layout of a CUDA model chooses the per-bucket copy itself."""
    for divisor in (1, 4):
        model = _model().cuda()
        reducer = GradReducer(model, bucket_cap_mb=0.0006, first_bucket_cap_mb=0.0003)
        assert all(reducer._layout.batched_copies)
        if divisor != 1:
            _as_prescaled_ranks(reducer, divisor)
        count = len(reducer._layout.buckets)
        ops = _run_steps_on(reducer, model, divisor, device="cuda")[-1]  # prescaled: step 0, with the rebuild's copies
        if divisor == 1:
            assert ops["_foreach_copy_"] + ops["copy_"] == count, ops  # one launch per bucket
        else:  # a copy and an in-place divide per bucket; a one-gradient bucket: one `div` into its slot
            assert ops["_foreach_copy_"] == ops["_foreach_div_"] and ops["_foreach_copy_"] + ops["div"] == count, ops
        assert "_foreach_div" not in ops, ops
        reducer.remove()
