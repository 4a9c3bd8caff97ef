"""NonFiniteWatch (#18): one device op per step besides the gradient norm, and the same verdict as
checking every step at once: the first bad step, its epoch and this rank's loss, across buffer
folds, epoch changes and repeated steps."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer import nonfinite
from trainer.nonfinite import NonFiniteWatch, total_norm

NAN, INF = float("nan"), float("inf")


def _strategy() -> Any:
    return SimpleNamespace(root_device=torch.device("cpu"), all_gather_ranks=lambda tensor: tensor.reshape(1, -1))


def _raised(watch: NonFiniteWatch) -> str | None:
    try:
        watch.check(_strategy())
    except FloatingPointError as error:
        return str(error).split(":")[0] + (" loss bad" if "non-finite on rank(s) [0]" in str(error) else " loss ok")
    return None


def _reference(records: list[tuple[int, int, float, float | None]]) -> str | None:
    """What checking each step on the host would say: the first record with a non-finite norm."""
    for step, epoch, norm, loss in records:
        if not torch.isfinite(torch.tensor(norm)):
            loss_ok = loss is None or bool(torch.isfinite(torch.tensor(loss)))
            return f"step {step}, epoch {epoch}" + (" loss ok" if loss_ok else " loss bad")
    return None


def _feed(watch: NonFiniteWatch, records: list[tuple[int, int, float, float | None]]) -> None:
    for step, epoch, norm, loss in records:
        watch.record(step, epoch, torch.tensor(norm), None if loss is None else torch.tensor(loss))


@pytest.mark.parametrize("seed", range(12))
def test_the_first_bad_step_is_named_as_a_per_step_check_would(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(nonfinite, "_ROWS", 4)  # many folds: full buffers, new epochs, repeated steps
    rng = random.Random(seed)
    records, step, epoch = [], 0, 0
    for _ in range(30):
        norm = rng.choice([1.0, 2.0, 3.0, NAN, INF]) if rng.random() < 0.15 else 1.0
        records.append((step, epoch, norm, rng.choice([0.5, None, NAN, INF, -INF])))
        if rng.random() < 0.8:  # otherwise the same step again (a closure the optimizer runs twice)
            step += 1
        if rng.random() < 0.1:
            epoch += 1
    watch = NonFiniteWatch()
    _feed(watch, records)
    assert _raised(watch) == _reference(records)


def test_verdicts_read_in_between_keep_the_first_bad_step() -> None:
    watch = NonFiniteWatch()
    _feed(watch, [(0, 0, 1.0, 0.5), (1, 0, 1.0, 0.5)])
    assert _raised(watch) is None
    _feed(watch, [(2, 0, NAN, 0.5), (3, 0, INF, NAN)])
    assert _raised(watch) == "step 2, epoch 0 loss ok"
    _feed(watch, [(4, 1, NAN, NAN)])
    assert _raised(watch) == "step 2, epoch 0 loss ok"


def test_losses_are_judged_element_by_element_and_without_rounding() -> None:
    watch = NonFiniteWatch()
    big = torch.tensor(1e300, dtype=torch.float64)  # finite, though not as a float32
    watch.record(0, 0, torch.tensor(NAN), big)
    assert _raised(watch) == "step 0, epoch 0 loss ok"
    watch = NonFiniteWatch()
    watch.record(0, 0, torch.tensor(NAN), torch.tensor([1.0, 3e38, 3e38]))  # summing would overflow
    assert _raised(watch) == "step 0, epoch 0 loss ok"
    watch = NonFiniteWatch()
    watch.record(0, 0, torch.tensor(INF), torch.tensor([1.0, NAN, 2.0]))
    assert _raised(watch) == "step 0, epoch 0 loss bad"


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


_NO_KERNEL = {"detach", "view", "select", "promote_types", "_reshape_alias", "alias"}


def test_a_step_costs_the_norm_and_one_write_with_no_host_read() -> None:
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = SimpleNamespace(param_groups=[{"params": params}])
    strategy = SimpleNamespace(gradient_buffers=lambda grads: None, gradient_norm=lambda optimizer: None,
                                   reduced_gradients_finite=lambda grads: None)
    watch, loss = NonFiniteWatch(), torch.tensor(0.5)
    watch.usable(strategy, optimizer, loss, policy="error", scaled=False, step=0, epoch=0)  # buffers made here
    mode = _CountOps()
    with mode:
        for step in range(1, 11):
            assert watch.usable(strategy, optimizer, loss, policy="error", scaled=False, step=step, epoch=0)
    kernels = {op: count for op, count in mode.ops.items() if op not in _NO_KERNEL}
    # the norm (foreach norm, stack, vector norm) and one stack into the buffer; no read (_local_scalar_dense)
    assert kernels == {"_foreach_norm": 10, "stack": 20, "linalg_vector_norm": 10}
    assert _raised(watch) is None


def test_folding_the_buffer_reads_nothing_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nonfinite, "_ROWS", 4)
    watch, mode = NonFiniteWatch(), _CountOps()
    records = [(step, 0, NAN if step == 5 else 1.0, 0.5) for step in range(10)] + [(10, 1, 1.0, 0.5)]
    with mode:  # folds: two full buffers, then a new epoch
        _feed(watch, records)
    assert mode.ops["_foreach_norm"] == 0 and mode.ops["argmin"] == 3
    assert mode.ops["_local_scalar_dense"] == 0 and mode.ops["item"] == 0
    assert _raised(watch) == "step 5, epoch 0 loss ok"


def test_total_norm_is_get_total_norms_value() -> None:
    torch.manual_seed(0)
    same = [torch.randn(5, 7), torch.randn(3), torch.randn(11)]
    assert torch.equal(total_norm(same), torch.nn.utils.get_total_norm(same))
    mixed = [torch.randn(5), torch.randn(4, dtype=torch.float64)]  # two groups: torch's own path
    assert torch.equal(total_norm(mixed), torch.nn.utils.get_total_norm(mixed))
    assert not torch.isfinite(total_norm([torch.randn(3), torch.tensor([1.0, NAN])]))
