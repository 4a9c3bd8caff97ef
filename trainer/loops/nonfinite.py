"""Non-finite gradients (`Trainer(on_nonfinite=...)`) without waiting for the device every step.

"error" (the default) must name the first step whose reduced gradients were NaN/inf and the ranks
whose loss was non-finite then. Asking the host "is the norm finite?" after every backward would
make the host wait for the device each step. Instead each step's verdict is folded into a few
tensors on the device (the first bad step, its epoch, whether this rank's loss was finite there),
and the host reads them where the loop reads values anyway: when step metrics go to the loggers,
at the end of each epoch, before a checkpoint is written, and when fit ends. The error is raised
there, naming the step it came from; a checkpoint is never written after a bad step. The steps in
between still ran (their weights are NaN anyway).

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


class NonFiniteWatch:
    """One fit's verdicts on its gradients; `check()` raises for the first bad step seen."""

    def __init__(self) -> None:
        self._first_bad: torch.Tensor | None = None  # (step, epoch, loss finite on this rank) or -1s

    def usable(self, trainer: Any, optimizer: Any, loss: torch.Tensor | None) -> bool:
        """Whether the optimizer may step now (False only under "skip"); `loss` is this rank's."""
        if trainer.on_nonfinite == "ignore" or trainer.precision_plugin.scaler is not None:
            return True
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return True
        finite = torch.isfinite(torch.nn.utils.get_total_norm(grads))
        if trainer.on_nonfinite == "skip":
            if bool(finite):
                return True
            warnings.warn(f"step {trainer.global_step}: non-finite gradients, optimizer step skipped "
                          "(on_nonfinite='skip').", stacklevel=3)
            return False
        self._remember(trainer, finite, loss)
        return True

    def _remember(self, trainer: Any, finite: torch.Tensor, loss: torch.Tensor | None) -> None:
        device = finite.device
        loss_ok = torch.isfinite(loss.detach()).all() if loss is not None else torch.ones((), dtype=torch.bool)
        now = torch.stack([torch.full((), trainer.global_step, dtype=torch.int64, device=device),
                           torch.full((), trainer.current_epoch, dtype=torch.int64, device=device),
                           loss_ok.to(device=device, dtype=torch.int64)])
        if self._first_bad is None:
            self._first_bad = torch.full((3,), _NONE, dtype=torch.int64, device=device)
        first_bad_this_step = (~finite) & (self._first_bad[0] == _NONE)
        self._first_bad = torch.where(first_bad_this_step, now, self._first_bad)

    def check(self, trainer: Any) -> None:
        """Raise if a step so far had non-finite gradients. Every rank calls it at the same point."""
        if self._first_bad is None:
            return
        step, epoch, loss_finite = self._first_bad.tolist()  # the host waits for the device here only
        if step == _NONE:
            return
        flags = trainer.strategy.all_gather(torch.tensor([float(loss_finite)], device=trainer.strategy.root_device))
        culprits = [rank for rank, flag in enumerate(flags.flatten().tolist()) if flag == 0.0]
        where = f"the loss was non-finite on rank(s) {culprits}" if culprits else "every rank's loss was finite"
        raise FloatingPointError(f"step {step}, epoch {epoch}: gradients are NaN/inf after the reduction; {where}. "
                                 "Lower the learning rate, clip gradients, check the data, or pass "
                                 "on_nonfinite='skip' to skip such steps.")
