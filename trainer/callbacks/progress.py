"""TQDMProgressBar: one training bar per epoch and an evaluation bar, drawn on global rank 0 only.

When stdout is not a terminal (CI logs, pipes, files) redrawn bars become thousands of lines,
so the bar prints one summary line per epoch instead.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from tqdm import tqdm
from typing_extensions import override

from trainer.callbacks.base import Callback
from trainer.callbacks.telemetry import TelemetryMonitor
from trainer.contract import TrainerContract
from trainer.schedule import validates_in_epoch

# A terminal redraws the bar's metrics at most this often: reading them waits for the device.
_POSTFIX_INTERVAL_S = 0.1


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


class TQDMProgressBar(Callback):
    """Lightning's tqdm bar: speed (it/s) and loss plus `prog_bar=True` metrics in the postfix.
    Other ranks draw nothing, so N processes never interleave N bars on one terminal."""

    def __init__(self, refresh_rate: int = 1, leave: bool = False) -> None:
        if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
            raise ValueError(f"TQDMProgressBar(refresh_rate={refresh_rate!r}) must be an int >= 0 (0 disables it).")
        self.refresh_rate, self.leave = refresh_rate, leave
        self.train_progress_bar: tqdm | None = None
        self.eval_progress_bar: tqdm | None = None
        self._enabled = True
        self._rank_zero = True
        self._eval_done = 0
        self._interactive = True
        self._epoch_started = 0.0
        self._postfix_drawn_at = float("-inf")

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self._rank_zero and self.refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        return not self.is_enabled

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def trainer(self) -> Any:
        """The Trainer this bar is attached to (set in `setup`), as Lightning's ProgressBar offers."""
        trainer = getattr(self, "_trainer", None)
        if trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer yet (it is, from setup on).")
        return trainer

    @property
    def total_train_batches(self) -> int | float:
        """Lightning's progress-bar totals (inf for data without a length)."""
        return self._trainer_attr("num_training_batches", float("inf"))

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches of this epoch: 0 in a fit epoch that does not validate (Lightning's)."""
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and trainer.state.fn == "fit" and not trainer.sanity_checking \
                and not validates_in_epoch(trainer):
            return 0
        counts = self._trainer_attr("num_val_batches", [])
        return sum(counts) if counts else 0

    @property
    def total_test_batches(self) -> int | float:
        counts = self._trainer_attr("num_test_batches", [])
        return sum(counts) if counts else 0

    @property
    def total_predict_batches(self) -> int | float:
        counts = self._trainer_attr("num_predict_batches", [])
        return sum(counts) if counts else 0

    def _trainer_attr(self, name: str, default: Any) -> Any:
        trainer = getattr(self, "_trainer", None)
        return getattr(trainer, name, default) if trainer is not None else default

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_trainer", None)  # the trainer travels to workers on its own
        return state

    def get_metrics(self, trainer: TrainerContract, pl_module: Any) -> dict[str, Any]:
        """What the postfix shows: the loss, then every `prog_bar=True` metric, then `v_num`."""
        shown = {key: _scalar(value) for key, value in trainer.progress_bar_metrics.items()}
        if not any("loss" in key for key in shown):
            for key in ("loss", "train_loss"):
                if key in trainer.callback_metrics:
                    shown = {key: _scalar(trainer.callback_metrics[key]), **shown}
                    break
        for callback in trainer.callbacks:  # telemetry shows in the text, not in the metrics dicts
            if isinstance(callback, TelemetryMonitor) and callback.prog_bar:
                shown.update(callback.progress_bar_figures)
        if trainer.logger is not None and trainer.logger.version != "":
            shown["v_num"] = trainer.logger.version
        return shown

    def print(self, *args: Any, sep: str = " ", end: str = "\n", file: Any = None, **_: Any) -> None:
        """Print above the bars instead of through them."""
        if not _shown(self.train_progress_bar) and not _shown(self.eval_progress_bar):
            print(*args, sep=sep, end=end, file=file)
        else:
            tqdm.write(sep.join(map(str, args)), file=file, end=end)

    def _bar(self, desc: str, total: Any, leave: bool, position: int = 0) -> tqdm:
        """Outside a terminal the bar still counts (code may read `.n`/`.total`, as of Lightning's
        bars) but draws nothing: one line per epoch is printed instead."""
        return tqdm(desc=desc, total=_bar_total(total), leave=leave, position=position, dynamic_ncols=True,
                    file=sys.stdout, smoothing=0, disable=not self._interactive)

    def _advance(self, bar: tqdm | None, done: int, postfix: Callable[[], dict[str, Any]] | None = None) -> None:
        """Move `bar` to `done`. The metrics are read (which waits for the device) only when they will
        be drawn: in a terminal, at most every `_POSTFIX_INTERVAL_S` and at the bar's end."""
        if bar is None or (done % self.refresh_rate != 0 and done != bar.total):
            return
        bar.n = done
        if bar.disable:
            return
        now = time.perf_counter()
        if postfix is not None and (done == bar.total or now - self._postfix_drawn_at >= _POSTFIX_INTERVAL_S):
            bar.set_postfix(postfix(), refresh=False)
            self._postfix_drawn_at = now
        bar.refresh()

    @override
    def setup(self, trainer: TrainerContract, pl_module: Any, stage: str) -> None:
        self._trainer = trainer
        self._rank_zero = trainer.is_global_zero
        self._interactive = stdout_is_terminal()

    @override
    def on_train_epoch_start(self, trainer: TrainerContract, pl_module: Any) -> None:
        self._epoch_started = time.perf_counter()
        if not self.is_enabled:
            return
        desc = f"Epoch {trainer.current_epoch}"
        total = _train_total(trainer)
        # Like Lightning: leave=True closes each epoch's bar (it stays on screen) and opens a new one;
        # otherwise one bar is reset every epoch and the last state stays visible after training.
        if not _shown(self.train_progress_bar) or self.leave:
            self.train_progress_bar = self._bar(desc, total, leave=True)
        else:
            assert self.train_progress_bar is not None
            self.train_progress_bar.reset(total=_bar_total(total))
            self.train_progress_bar.set_description(desc, refresh=False)

    @override
    def on_train_batch_end(self, trainer: TrainerContract, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.train_progress_bar is not None:
            self._advance(self.train_progress_bar, batch_idx + 1, lambda: self.get_metrics(trainer, pl_module))

    @override
    def on_train_epoch_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        if self.is_enabled and not self._interactive:
            self._print_epoch_line(trainer, pl_module)
        if self.train_progress_bar is not None:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
            if self.leave:
                self._close_train()

    @override
    def on_train_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        self._close_train()

    def _print_epoch_line(self, trainer: TrainerContract, pl_module: Any) -> None:
        seconds = time.perf_counter() - self._epoch_started
        metrics = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in self.get_metrics(trainer, pl_module).items())
        speed = trainer.num_training_batches / seconds if seconds > 0 else 0.0
        print(f"Epoch {trainer.current_epoch}: step {trainer.global_step}  {metrics}  "
              f"[{seconds:.2f} s, {speed:.1f} it/s]", flush=True)

    @override
    def on_validation_start(self, trainer: TrainerContract, pl_module: Any) -> None:
        if self.is_enabled:
            position = 1 if _shown(self.train_progress_bar) else 0
            self.eval_progress_bar = self._bar("Validation", sum(trainer.num_val_batches), False, position)
            self._eval_done = 0

    @override
    def on_validation_batch_end(self, trainer: TrainerContract, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._eval_done += 1
        self._advance(self.eval_progress_bar, self._eval_done)

    @override
    def on_validation_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        self._close_eval()
        if self.train_progress_bar is not None:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    @override
    def on_exception(self, trainer: TrainerContract, pl_module: Any, exception: BaseException) -> None:
        self._close_eval()
        self._close_train()

    def _close_eval(self) -> None:
        if self.eval_progress_bar is not None:
            self.eval_progress_bar.close()  # kept (closed) for code that reads its counts afterwards

    def _close_train(self) -> None:
        if self.train_progress_bar is not None:
            self.train_progress_bar.close()


def _shown(bar: tqdm | None) -> bool:
    """An open bar drawing on the terminal (a closed or counting-only bar is not)."""
    return bar is not None and not bar.disable


def _train_total(trainer: TrainerContract) -> Any:
    """Batches per epoch; for data without a length, the max_steps the fit runs to (Lightning's)."""
    total = trainer.num_training_batches
    return trainer.max_steps if total == float("inf") and trainer.max_steps > 0 else total


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def _bar_total(total: Any) -> int | None:
    return None if total is None or total == float("inf") else int(total)
