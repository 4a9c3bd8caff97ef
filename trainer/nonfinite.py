"""Non-finite gradients (`Trainer(on_nonfinite=...)`) without waiting for the device every step.

"error" (the default) must name the first step whose reduced gradients were NaN/inf and the ranks
whose loss was non-finite then. Asking the host "is the norm finite?" after every backward would
make the host wait for the device each step. Instead each step's verdict stays on the device, and
the host reads it where the loop reads values anyway: when step metrics go to the loggers, at the
end of each epoch, before a checkpoint is written, and when fit ends. The error is raised there,
naming the step it came from; a checkpoint is never written after a bad step. The steps in between
still ran (their weights are NaN anyway).

Our DDP between CPU ranks of one host already knows the verdict: its transport looked at every share it
summed (strategies/finite_verdict.py), so then the check reads nothing unless a gradient changed since. A
write that autograd's version counter does not see (through `.data`, or numpy) goes unseen at its step; the
next step's reduction carries it and is named instead.

Each step costs one device op besides the gradient norm: the norm and the loss are written side by
side into a row of a small device buffer (a few launches per step are what a compiled GPU step
notices). The norm itself reads the strategy's flat gradient buffers when it keeps them (our DDP's
buckets: a few tensors instead of one per parameter); only its finiteness is used. The rows are one
run of consecutive steps of one epoch, so row `i` is step `first + i`; the host folds them into the
first bad (step, epoch, loss finite) record when the buffer is full, when the run breaks, and before it
reads the record.

"skip" has to decide before the optimizer steps, so it reads the verdict at once (one wait per
step, the price of skipping). "ignore", and a GradScaler (which skips overflowing steps itself),
check nothing. After the reduction the gradients are identical on every rank, so every rank finds
the same first bad step and raises at the same point; naming the culprits is one all-gather there.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

_NONE = -1
_ROWS = 256  # steps buffered on the device between folds (bounded memory when nothing reads sooner)
# Stand-ins for the norm when the strategy already knows the verdict (its gradients are on the CPU then).
_FINITE, _NOT_FINITE = torch.zeros(()), torch.full((), float("inf"))


class NonFiniteWatch:
    """One fit's verdicts on its gradients; `check()` raises for the first bad step seen."""

    def __init__(self) -> None:
        self._first_bad: torch.Tensor | None = None  # (step, epoch, loss finite on this rank) or -1s
        self._rows: torch.Tensor | None = None  # (_ROWS, 2): each step's gradient norm and loss value
        self._filled = 0
        self._run_start = (0, 0)  # (step, epoch) of row 0

    def usable(self, strategy: Any, optimizer: Any, loss: torch.Tensor | None, *, policy: str, scaled: bool,
               step: int, epoch: int) -> bool:
        """Whether the optimizer may step now (False only under "skip"); `loss` is this rank's, `policy` the
        Trainer's `on_nonfinite`, `scaled` whether a GradScaler scales the loss, (`step`, `epoch`) where the fit is."""
        if policy == "ignore" or scaled:
            return True
        norm = strategy.gradient_norm(optimizer)  # ZeRO: across the ranks' shards (a collective)
        if norm is None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if not grads:
                return True
            verdict = strategy.reduced_gradients_finite(grads)  # seen while they were averaged: no pass here
            if verdict is not None:
                norm = _FINITE if verdict else _NOT_FINITE
            else:
                norm = total_norm(strategy.gradient_buffers(grads) or grads)
        if policy == "skip":
            if bool(torch.isfinite(norm)):
                return True
            warnings.warn(f"step {step}: non-finite gradients, optimizer step skipped "
                          "(on_nonfinite='skip').", stacklevel=3)
            return False
        self.record(step, epoch, norm, loss)
        return True

    def record(self, step: int, epoch: int, norm: torch.Tensor, loss: torch.Tensor | None) -> None:
        """Keep step `step`'s verdict on the device: one write of (norm, loss) into the next row."""
        norm = norm.detach()
        value = _loss_value(loss, norm)
        dtype = torch.promote_types(norm.dtype, value.dtype)  # a wider float keeps finiteness exactly
        if self._filled and (step, epoch) != (self._run_start[0] + self._filled, self._run_start[1]):
            self._fold()  # a repeated step (a closure run twice) or a new epoch starts a new run
        if self._rows is None or self._rows.device != norm.device or self._rows.dtype != dtype:
            self._fold()
            self._rows = torch.empty((_ROWS, 2), dtype=dtype, device=norm.device)
        if not self._filled:
            self._run_start = (step, epoch)
        torch.stack([norm, value], out=self._rows[self._filled])
        self._filled += 1
        if self._filled == _ROWS:
            self._fold()

    def _fold(self) -> None:
        """Merge the buffered run into the first-bad record (a handful of device ops, no host read)."""
        if not self._filled:
            return
        assert self._rows is not None
        finite = torch.isfinite(self._rows[:self._filled])  # (rows, 2): gradients, loss
        grads_ok = finite[:, 0]
        row = grads_ok.to(torch.int64).argmin()  # the first bad row, when there is one
        step, epoch = self._run_start
        loss_ok = finite[:, 1].gather(0, row.reshape(1)).reshape(())  # not finite[row, 1]: that reads `row`
        now = torch.stack([row + step, torch.full_like(row, epoch), loss_ok.to(torch.int64)])
        if self._first_bad is None:
            self._first_bad = torch.full((3,), _NONE, dtype=torch.int64, device=now.device)
        first_bad_here = grads_ok.logical_not().any() & (self._first_bad[0] == _NONE)
        self._first_bad = torch.where(first_bad_here, now, self._first_bad)
        self._filled = 0

    def check(self, strategy: Any) -> None:
        """Raise if a step so far had non-finite gradients. Every rank calls it at the same point (naming the
        ranks whose loss was non-finite is one all-gather over `strategy`)."""
        self._fold()
        if self._first_bad is None:
            return
        step, epoch, loss_finite = self._first_bad.tolist()  # the host waits for the device here only
        if step == _NONE:
            return
        flags = strategy.all_gather_ranks(torch.tensor([float(loss_finite)], device=strategy.root_device))
        culprits = [rank for rank, flag in enumerate(flags.flatten().tolist()) if flag == 0.0]
        where = f"the loss was non-finite on rank(s) {culprits}" if culprits else "every rank's loss was finite"
        raise FloatingPointError(f"step {step}, epoch {epoch}: gradients are NaN/inf after the reduction; {where}. "
                                 "Lower the learning rate, clip gradients, check the data, or pass "
                                 "on_nonfinite='skip' to skip such steps.")


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """`torch.nn.utils.get_total_norm(grads)` (the 2-norm of the per-tensor 2-norms), the same kernels
    in the same order. When every gradient is a plain tensor of one device and dtype, as in one DDP
    rank, that is one foreach norm and one vector norm; this path skips get_total_norm's grouping and
    its per-tensor `.to(device)` calls, host work that grows with the number of parameters."""
    first = grads[0]
    if len(grads) == 1 and type(first) is torch.Tensor:
        return torch.linalg.vector_norm(first, 2.0)  # the same value (the norm of one norm is itself), 2 ops fewer
    if first.device.type not in _FOREACH_DEVICES or any(
            type(g) is not torch.Tensor or g.device != first.device or g.dtype != first.dtype for g in grads):
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)


_FOREACH_DEVICES = ("cpu", "cuda")


def _loss_value(loss: torch.Tensor | None, norm: torch.Tensor) -> torch.Tensor:
    """A scalar on the norm's device that is finite exactly when every element of `loss` is (no loss
    counts as finite). A one-element loss is itself (a view: no device op)."""
    if loss is None:
        return torch.zeros((), dtype=norm.dtype, device=norm.device)
    loss = loss.detach()
    if loss.numel() != 1:
        loss = (loss * 0).sum()  # finite * 0 is 0, inf or NaN * 0 is NaN; no overflow, unlike a plain sum
    return loss.reshape(()).to(norm.device)
