"""Per-step host overhead of our Trainer against a hand-written PyTorch loop (#18).

A tiny model (one small Linear layer, 1 process, 1 thread) makes each step's arithmetic cost a few
microseconds, so what is left is the Python each side runs around it: hook dispatch, logging, the
non-finite check. Once kernels are fast (a compiled model on a GPU) this host work is what limits
throughput, so it is measured on its own here.

* **ours**: `Trainer(accelerator="cpu", devices=1)` with its defaults, as a user has them (progress
  bar, model summary, checkpointing, TensorBoard logger, telemetry, `on_nonfinite="error"`); the
  module logs its loss with `prog_bar=True` every step.
* **raw**: the same model, data loader and optimizer in a plain loop (zero_grad, forward, backward,
  step) that reads the loss on the host every `log_every_n_steps`, as the Trainer's default does.

Both record a timestamp at the start of every `training_step`; a repeat's figure is the mean step
between the end of the warm-up and the last step. Repeats alternate ours/raw (order flipped every
round) and the medians are reported with their ratio, since the machine's other load drifts.

    python -m benchmarks.step_overhead                    # 7 rounds of 400 steps each
    python -m benchmarks.step_overhead --profile 25       # + cProfile of our steady-state steps
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import LightningModule, Trainer

WIDTH, BATCH, LOG_EVERY = 16, 8, 50


def _loader(steps: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(steps * BATCH, WIDTH, generator=generator),
                         torch.randn(steps * BATCH, 1, generator=generator))
    return DataLoader(data, batch_size=BATCH)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(WIDTH, 1)


class TinyModule(LightningModule):
    """The user's module: a loss logged to the progress bar every step. It stamps the time at each
    step (and optionally runs a profiler over the steps after the warm-up), nothing else."""

    def __init__(self, warmup: int, profiler: cProfile.Profile | None = None) -> None:
        super().__init__()
        self.net = _model()
        self.stamps: list[float] = []
        self.warmup, self.profiler = warmup, profiler

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        if self.profiler is not None and batch_idx == self.warmup:
            self.profiler.enable()
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_train_end(self) -> None:
        if self.profiler is not None:
            self.profiler.disable()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The bar's and the summary's output is not what is measured; the cost of writing it is."""
    with open("/dev/null", "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def run_ours(steps: int, warmup: int, profiler: cProfile.Profile | None = None) -> float:
    """Seconds per step of our Trainer's fit, steps `warmup`..`steps - 1`."""
    module = TinyModule(warmup, profiler)
    with tempfile.TemporaryDirectory() as root, _quiet():
        trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=root,
                          log_every_n_steps=LOG_EVERY)
        trainer.fit(module, _loader(steps))
    return _per_step(module.stamps, warmup)


def run_raw(steps: int, warmup: int) -> float:
    """Seconds per step of the hand-written loop doing the same work."""
    model, stamps = _model(), []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    for batch_idx, (x, y) in enumerate(_loader(steps)):
        stamps.append(time.perf_counter())
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if (batch_idx + 1) % LOG_EVERY == 0:
            loss.item()
    return _per_step(stamps, warmup)


def _per_step(stamps: list[float], warmup: int) -> float:
    return (stamps[-1] - stamps[warmup]) / (len(stamps) - 1 - warmup)


def measure(rounds: int, steps: int, warmup: int) -> dict[str, list[float]]:
    """Interleaved rounds; the order within a round alternates so neither side always runs second."""
    times: dict[str, list[float]] = {"ours": [], "raw": []}
    runners = {"ours": lambda: run_ours(steps, warmup), "raw": lambda: run_raw(steps, warmup)}
    for round_idx in range(rounds):
        order = ["ours", "raw"] if round_idx % 2 == 0 else ["raw", "ours"]
        for name in order:
            times[name].append(runners[name]())
    return times


def profile_ours(steps: int, warmup: int, top: int) -> str:
    """cProfile of our steady-state steps (from the warm-up's end to the end of the fit's training)."""
    profiler = cProfile.Profile()
    run_ours(steps, warmup, profiler)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N functions of a profile")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run_ours(args.warmup + 10, args.warmup)  # first-use costs (imports, allocator) in neither side's figures
    times = measure(args.rounds, args.steps, args.warmup)
    ours, raw = statistics.median(times["ours"]), statistics.median(times["raw"])
    for name, values in times.items():
        print(f"{name:>4}: median {statistics.median(values) * 1e3:.3f} ms/step  "
              f"(min {min(values) * 1e3:.3f}, max {max(values) * 1e3:.3f}; {len(values)} rounds)")
    paired = [o / r for o, r in zip(times["ours"], times["raw"])]
    print(f"ours / raw: {ours / raw:.2f}x (paired rounds {min(paired):.2f}-{max(paired):.2f}); "
          f"overhead {(ours - raw) * 1e3:.3f} ms/step")
    if args.profile:
        sys.stdout.write(profile_ours(args.steps * 3, args.warmup, args.profile))


if __name__ == "__main__":
    main()
