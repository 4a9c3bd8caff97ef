"""Where `self.log` may be called, and what it records there unless told otherwise (Lightning's rules).

Each hook that accepts `self.log` has a rule: the `on_step` and `on_epoch` values it allows and
their defaults. Training steps and the hooks around an optimizer step log per step by default;
evaluation steps and their batch hooks log per epoch by default; start and epoch hooks have no
step to log at, so they take per-epoch values only. Every other hook (setup, teardown, dataloader
and batch-transfer hooks, checkpoint hooks, everything in predict, ...) refuses `self.log`: write
to the logger directly there (`self.logger.experiment`). A callback's `self.log` follows the rule
of the hook it runs in.

`MetricStore.log` consults `logging_levels` once per call; nothing else decides these values.
"""

from __future__ import annotations

from dataclasses import dataclass


class LoggingError(ValueError):
    """`self.log` was called where, or with options that, the Trainer cannot log."""


@dataclass(frozen=True)
class _Rule:
    on_step: tuple[bool, ...]  # the values allowed
    on_epoch: tuple[bool, ...]
    default_on_step: bool
    default_on_epoch: bool


_EITHER = (False, True)
_PER_STEP = _Rule(_EITHER, _EITHER, default_on_step=True, default_on_epoch=False)
_PER_EVAL_BATCH = _Rule(_EITHER, _EITHER, default_on_step=False, default_on_epoch=True)
_EPOCH_ONLY = _Rule((False,), (True,), default_on_step=False, default_on_epoch=True)

RULES: dict[str, _Rule] = {
    **dict.fromkeys(("training_step", "on_train_batch_start", "on_train_batch_end", "on_before_zero_grad",
                     "optimizer_zero_grad", "on_before_backward", "backward", "on_after_backward",
                     "on_before_optimizer_step", "configure_gradient_clipping", "clip_gradients", "optimizer_step"),
                    _PER_STEP),
    **dict.fromkeys(("validation_step", "on_validation_batch_start", "on_validation_batch_end",
                     "test_step", "on_test_batch_start", "on_test_batch_end"), _PER_EVAL_BATCH),
    **dict.fromkeys(("on_train_start", "on_train_epoch_start", "on_train_epoch_end",
                     "on_validation_start", "on_validation_epoch_start", "on_validation_epoch_end",
                     "on_test_start", "on_test_epoch_start", "on_test_epoch_end"), _EPOCH_ONLY),
}


def logging_levels(fx: str, name: str, on_step: bool | None, on_epoch: bool | None) -> tuple[bool, bool]:
    """The (on_step, on_epoch) a `self.log(name, ...)` in hook `fx` records; raises LoggingError
    where the hook refuses logging or the combination asked for."""
    rule = RULES.get(fx)
    if rule is None:
        raise LoggingError(f"self.log({name!r}) is not supported in {fx}. It works in the training, validation and "
                           "test steps and their batch, epoch and start hooks; elsewhere write to the logger "
                           "directly (self.logger.experiment).")
    on_step = rule.default_on_step if on_step is None else on_step
    on_epoch = rule.default_on_epoch if on_epoch is None else on_epoch
    if on_step not in rule.on_step or on_epoch not in rule.on_epoch:
        raise LoggingError(f"self.log({name!r}, on_step={on_step}, on_epoch={on_epoch}) in {fx}: this hook has no "
                           "step of its own, so it logs per epoch only (on_step=False, on_epoch=True).")
    if not on_step and not on_epoch:
        raise LoggingError(f"self.log({name!r}, on_step=False, on_epoch=False) in {fx} would record nothing; set "
                           "on_step=True or on_epoch=True.")
    return on_step, on_epoch
