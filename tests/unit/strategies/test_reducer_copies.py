"""The reducer copies fresh gradients into a bucket with one foreach op when the bucket completes, not one
copy per parameter as each arrives: on a GPU each copy is a kernel launch the host pays for (#30)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from strategies.reducer import GradReducer


class _CopyOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._overloadpacket.__name__
        if "copy" in name:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def test_one_foreach_copy_per_bucket_and_gradients_are_the_slots() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])  # 12 parameter tensors
    reducer = GradReducer(model, bucket_cap_mb=0.0006, first_bucket_cap_mb=0.0003)  # a few small buckets
    for step in range(3):
        model.zero_grad(set_to_none=True)
        inputs = torch.randn(4, 8)
        expected = torch.autograd.grad(model(inputs).sum(), list(model.parameters()))
        mode = _CopyOps()
        with mode:
            reducer.prepare_for_backward(None)
            model(inputs).sum().backward()
            reducer.finish_backward()
        buckets = reducer.summary()["buckets"]
        assert 1 < buckets < 12
        if step > 0:  # the first pass also moves every gradient into the rebuilt buckets
            assert mode.ops == {"_foreach_copy_": buckets}
        for param, grad, view in zip(model.parameters(), expected, reducer._layout.views):
            assert torch.equal(param.grad, grad) and param.grad is view
    reducer.remove()
