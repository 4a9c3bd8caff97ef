"""Per-step host overhead of our Trainer against a hand-written PyTorch loop (#18).

A model whose arithmetic costs next to nothing (1 process, 1 thread) leaves what each side runs
around the kernels: hook dispatch, logging, the non-finite check. Once kernels are fast (a compiled
model on a GPU) this host work is what limits throughput, so it is measured on its own here.

* `--model linear` (default): one 16 -> 1 Linear layer, batch 8, SGD: the loop's fixed cost.
* `--model gpt_host`: the benchmark's host-bound GPT (gpt's graph and 77 parameter tensors at width
  32), AdamW: what grows with the number of parameters. `--compile` compiles both sides
  (`torch.compile(model)` in the plain loop, `torch.compile(module)` handed to our Trainer).

* **ours**: `Trainer(accelerator="cpu", devices=1)` with its defaults, as a user has them (progress
  bar, model summary, checkpointing, TensorBoard logger, telemetry, `on_nonfinite="error"`); the
  module logs its loss with `prog_bar=True` every step. `--variant KEY=VALUE` (repeatable) adds a
  contender with that Trainer argument changed, to see what one default costs.
* **raw**: the same model, data loader and optimizer in a plain loop (zero_grad, forward, backward,
  step) that reads the loss on the host every `log_every_n_steps`, as the Trainer's default does.

Both record a timestamp at the start of every `training_step`; a repeat's figure is the mean step
between the end of the warm-up and the last step. Contenders alternate (order reversed every round)
and the medians are reported with their ratio to raw, since the machine's other load drifts.

    python -m benchmarks.step_overhead                    # 7 rounds of 400 steps each
    python -m benchmarks.step_overhead --profile 25       # + cProfile of our steady-state steps
    python -m benchmarks.step_overhead --model gpt_host --compile --variant on_nonfinite=ignore
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import cProfile
import functools
import io
import pstats
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.workloads import WORKLOADS, loss_fn
from trainer import LightningModule, Trainer

WIDTH, BATCH, LOG_EVERY = 16, 8, 50


@dataclass(frozen=True)
class Case:
    """What both sides train: a model, its batches, its loss and its optimizer."""

    model: Callable[[], nn.Module]
    loader: Callable[[int], DataLoader]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    optimizer: Callable[[Any], torch.optim.Optimizer]


def _linear_loader(steps: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(steps * BATCH, WIDTH, generator=generator),
                         torch.randn(steps * BATCH, 1, generator=generator))
    return DataLoader(data, batch_size=BATCH)


def _linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(WIDTH, 1)


_GPT = WORKLOADS["gpt_host"]
CASES = {
    "linear": Case(_linear, _linear_loader, lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1]),
                   lambda params: torch.optim.SGD(params, lr=0.01)),
    "gpt_host": Case(_GPT.model, lambda steps: DataLoader(_GPT.dataset(steps * _GPT.batch_size),
                                                          batch_size=_GPT.batch_size),
                     loss_fn, lambda params: torch.optim.AdamW(params, lr=_GPT.lr)),
}


class TinyModule(LightningModule):
    """The user's module: a loss logged to the progress bar every step. It stamps the time at each
    step (and optionally runs a profiler over the steps after the warm-up), nothing else."""

    def __init__(self, case: Case, warmup: int, profiler: cProfile.Profile | None = None) -> None:
        super().__init__()
        self.case, self.net = case, case.model()
        self.stamps: list[float] = []
        self.warmup, self.profiler = warmup, profiler

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.stamps.append(time.perf_counter())  # outside training_step, which --compile compiles
        if self.profiler is not None and batch_idx == self.warmup:
            self.profiler.enable()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.case.loss(self.net, batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_train_end(self) -> None:
        if self.profiler is not None:
            self.profiler.disable()

    def configure_optimizers(self) -> Any:
        return self.case.optimizer(self.parameters())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The bar's and the summary's output is not what is measured; the cost of writing it is."""
    with open("/dev/null", "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def run_ours(case: Case, compile_: bool, steps: int, warmup: int, profiler: cProfile.Profile | None = None,
             **trainer_args: Any) -> float:
    """Seconds per step of our Trainer's fit, steps `warmup`..`steps - 1`."""
    _fresh_compiles(compile_)
    module = TinyModule(case, warmup, profiler)
    with tempfile.TemporaryDirectory() as root, _quiet():
        trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=root,
                          log_every_n_steps=LOG_EVERY, **trainer_args)
        trainer.fit(torch.compile(module) if compile_ else module, case.loader(steps))
    return _per_step(module.stamps, warmup)


def run_raw(case: Case, compile_: bool, steps: int, warmup: int, torch_ddp: bool = False) -> float:
    """Seconds per step of the hand-written loop doing the same work; with `torch_ddp`, the model is
    wrapped in torch's DistributedDataParallel on a one-process gloo group (compiled the way torch
    recommends: the DDP module, so dynamo splits the graph at DDP's buckets)."""
    _fresh_compiles(compile_)
    model, stamps = case.model(), []
    optimizer = case.optimizer(model.parameters())
    model.train()
    with one_process_group() if torch_ddp else contextlib.nullcontext():
        step_model: nn.Module = DistributedDataParallel(model) if torch_ddp else model
        step_model = torch.compile(step_model) if compile_ else step_model
        _raw_loop(case, step_model, optimizer, steps, stamps)
    return _per_step(stamps, warmup)


def _raw_loop(case: Case, step_model: nn.Module, optimizer: torch.optim.Optimizer, steps: int,
              stamps: list[float]) -> None:
    for batch_idx, batch in enumerate(case.loader(steps)):
        stamps.append(time.perf_counter())
        optimizer.zero_grad()
        loss = case.loss(step_model, batch)
        loss.backward()
        optimizer.step()
        if (batch_idx + 1) % LOG_EVERY == 0:
            loss.item()


def _fresh_compiles(compile_: bool) -> None:
    """Every run compiles its own code: graphs cached by an earlier run (or dynamo's recompile limit,
    reached after a few runs, which silently falls back to eager) never leak into a figure."""
    if compile_:
        torch._dynamo.reset()


@contextlib.contextmanager
def one_process_group() -> Iterator[None]:
    """A gloo group of this process alone, gone afterwards (our Trainer's runs start their own)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _per_step(stamps: list[float], warmup: int) -> float:
    return (stamps[-1] - stamps[warmup]) / (len(stamps) - 1 - warmup)


def parse_variant(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` with VALUE a Python literal (a bare word stays a string)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected KEY=VALUE, e.g. on_nonfinite=ignore")
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def measure(runners: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Interleaved rounds; the order reverses every round so no contender always runs last."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    for round_idx in range(rounds):
        for name in (list(runners) if round_idx % 2 == 0 else list(reversed(runners))):
            times[name].append(runners[name]())
    return times


def profile_ours(case: Case, compile_: bool, steps: int, warmup: int, top: int, **trainer_args: Any) -> str:
    """cProfile of our steady-state steps (from the warm-up's end to the end of the fit's training)."""
    profiler = cProfile.Profile()
    run_ours(case, compile_, steps, warmup, profiler, **trainer_args)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(CASES), default="linear")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model on both sides (inductor)")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[], metavar="KEY=VALUE",
                        help="also run ours with this Trainer argument (repeatable)")
    parser.add_argument("--set", type=parse_variant, action="append", default=[], metavar="KEY=VALUE",
                        help="a Trainer argument for every run of ours, variants included (repeatable)")
    parser.add_argument("--torch-ddp", action="store_true",
                        help="also run the plain loop with the model in torch DDP (one process)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N functions of a profile")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    case = CASES[args.model]
    base = dict(args.set)
    runners: dict[str, Callable[[], float]] = {
        "raw": lambda: run_raw(case, args.compile, args.steps, args.warmup),
        "ours": lambda: run_ours(case, args.compile, args.steps, args.warmup, **base),
    }
    if args.torch_ddp:
        runners["raw torch DDP"] = functools.partial(run_raw, case, args.compile, args.steps, args.warmup, True)
    for key, value in args.variant:
        runners[f"ours {key}={value!r}"] = functools.partial(run_ours, case, args.compile, args.steps, args.warmup,
                                                             **{**base, key: value})
    run_ours(case, args.compile, args.warmup + 10, args.warmup, **base)  # first-use costs (imports, compiles) in no figure
    run_raw(case, args.compile, args.warmup + 10, args.warmup, args.torch_ddp)
    times = measure(runners, args.rounds)
    raw = statistics.median(times["raw"])
    print(f"model {args.model}{', compiled' if args.compile else ''}; ours with {base or 'defaults'}; "
          f"{args.rounds} rounds of {args.steps} steps")
    for name, values in times.items():
        median = statistics.median(values)
        paired = [value / raw_value for value, raw_value in zip(values, times["raw"])]
        print(f"{name:>28}: median {median * 1e3:.3f} ms/step (min {min(values) * 1e3:.3f}, max "
              f"{max(values) * 1e3:.3f}); / raw {median / raw:.2f}x (paired {min(paired):.2f}-{max(paired):.2f}); "
              f"overhead {(median - raw) * 1e3:.3f} ms/step")
    if args.profile:
        sys.stdout.write(profile_ours(case, args.compile, args.steps * 3, args.warmup, args.profile, **base))


if __name__ == "__main__":
    main()
