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
and the medians are reported with their ratio to raw, since the machine's other load drifts. Each
step is timed twice: wall time, and the CPU time of the thread running the loop, which other
processes on a shared machine disturb far less (it leaves out work on other threads: gloo's, at
world size 1 next to nothing).

    python -m benchmarks.step_overhead                    # 7 rounds of 400 steps each
    python -m benchmarks.step_overhead --profile 25       # + cProfile of our steady-state steps
    python -m benchmarks.step_overhead --model gpt_host --compile --variant on_nonfinite=ignore
    python -m benchmarks.step_overhead --model gpt_host --torch-ddp --gpu-settings --count-ops 10
    python -m benchmarks.step_overhead --model gpt_host --torch-ddp --gpu-settings --foreach --count-calls 50

* `--gpu-settings`: ours as the GPU benchmark's `ours` contender runs (benchmarks/gpu/loops.py): our DDP
  at world size 1, no logger, checkpointing, progress bar or summary, a module that logs nothing.
* `--count-ops N`: instead of timing, count per step (over N steady-state steps, eager) the ops each
  contender would launch on a GPU, by where they come from (benchmarks/op_count.py).
* `--foreach`: the optimizer's foreach implementation, CUDA's default (the CPU's is one tensor at a time).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import cProfile
import dataclasses
import functools
import io
import json
import pstats
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.call_count import CallWindow, format_calls
from benchmarks.gpu.loops import QUIET_TRAINER, compiled_module
from benchmarks.op_count import CountWindow, OpCounter, format_counts, per_step
from benchmarks.workloads import WORKLOADS, loss_fn
from trainer import LightningModule, Trainer

WIDTH, BATCH, LOG_EVERY = 16, 8, 50


class StepCost(NamedTuple):
    """Seconds per step: wall clock, and CPU time of the thread that ran the loop."""

    wall: float
    cpu: float


def stamp() -> StepCost:
    return StepCost(time.perf_counter(), time.thread_time())


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


def with_foreach(case: Case) -> Case:
    """The same case with the optimizer's foreach implementation, which CUDA picks by default."""
    def optimizer(params: Any) -> torch.optim.Optimizer:
        built = case.optimizer(params)
        for group in built.param_groups:
            group["foreach"] = True
        return built
    return dataclasses.replace(case, optimizer=optimizer)


class StepWindow(Protocol):
    """Something switched on for some of the steps (a profiler, an op counter), told of every step's start."""

    def at_step(self, batch_idx: int) -> None: ...

    def close(self) -> None: ...


class ProfileWindow:
    """cProfile from step `start` to the end of the run."""

    def __init__(self, profiler: cProfile.Profile, start: int) -> None:
        self.profiler, self.start = profiler, start

    def at_step(self, batch_idx: int) -> None:
        if batch_idx == self.start:
            self.profiler.enable()

    def close(self) -> None:
        self.profiler.disable()


class TinyModule(LightningModule):
    """The user's module: a loss logged to the progress bar every step (unless `log_loss` is False). It
    stamps the time at each step (and tells a step window, if any), nothing else."""

    def __init__(self, case: Case, window: StepWindow | None = None, log_loss: bool = True) -> None:
        super().__init__()
        self.case, self.net = case, case.model()
        self.stamps: list[StepCost] = []
        self.window, self.log_loss = window, log_loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.stamps.append(stamp())  # outside training_step, which --compile compiles
        if self.window is not None:
            self.window.at_step(batch_idx)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.case.loss(self.net, batch)
        if self.log_loss:
            self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_train_end(self) -> None:
        if self.window is not None:
            self.window.close()

    def configure_optimizers(self) -> Any:
        return self.case.optimizer(self.parameters())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The bar's and the summary's output is not what is measured; the cost of writing it is."""
    with open("/dev/null", "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def run_ours(case: Case, compile_: bool, steps: int, warmup: int, window: StepWindow | None = None,
             log_loss: bool = True, **trainer_args: Any) -> StepCost:
    """Seconds per step of our Trainer's fit, steps `warmup`..`steps - 1`."""
    _fresh_compiles(compile_)
    module = TinyModule(case, window, log_loss)
    with tempfile.TemporaryDirectory() as root, _quiet():
        trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=root,
                          log_every_n_steps=LOG_EVERY, **trainer_args)
        trainer.fit(compiled_module(module) if compile_ else module, case.loader(steps))
    return _per_step(module.stamps, warmup)


def run_raw(case: Case, compile_: bool, steps: int, warmup: int, torch_ddp: bool = False,
            window: StepWindow | None = None) -> StepCost:
    """Seconds per step of the hand-written loop doing the same work; with `torch_ddp`, the model is
    wrapped in torch's DistributedDataParallel on a one-process gloo group (compiled the way torch
    recommends: the DDP module, so dynamo splits the graph at DDP's buckets)."""
    _fresh_compiles(compile_)
    model, stamps = case.model(), list[StepCost]()
    optimizer = case.optimizer(model.parameters())
    model.train()
    with one_process_group() if torch_ddp else contextlib.nullcontext():
        step_model: nn.Module = DistributedDataParallel(model) if torch_ddp else model
        step_model = compiled_module(step_model) if compile_ else step_model
        _raw_loop(case, step_model, optimizer, steps, stamps, window)
    return _per_step(stamps, warmup)


def _raw_loop(case: Case, step_model: nn.Module, optimizer: torch.optim.Optimizer, steps: int,
              stamps: list[StepCost], window: StepWindow | None) -> None:
    for batch_idx, batch in enumerate(case.loader(steps)):
        stamps.append(stamp())
        if window is not None:
            window.at_step(batch_idx)
        optimizer.zero_grad()
        loss = case.loss(step_model, batch)
        loss.backward()
        optimizer.step()
        if (batch_idx + 1) % LOG_EVERY == 0:
            loss.item()
    if window is not None:
        window.close()


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


def _per_step(stamps: list[StepCost], warmup: int) -> StepCost:
    steps = len(stamps) - 1 - warmup
    return StepCost(*((last - first) / steps for last, first in zip(stamps[-1], stamps[warmup])))


def parse_variant(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` with VALUE a Python literal (a bare word stays a string)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected KEY=VALUE, e.g. on_nonfinite=ignore")
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def measure(runners: dict[str, Callable[..., StepCost]], rounds: int) -> dict[str, list[StepCost]]:
    """Interleaved rounds; the order reverses every round so no contender always runs last."""
    times: dict[str, list[StepCost]] = {name: [] for name in runners}
    for round_idx in range(rounds):
        for name in (list(runners) if round_idx % 2 == 0 else list(reversed(runners))):
            times[name].append(runners[name]())
    return times


def count_ops(runners: dict[str, Callable[..., StepCost]], warmup: int, steps: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per contender, {source: {op: launches per step}} over `steps` steps after `warmup` (eager only:
    compiled code does not dispatch op by op through Python)."""
    results = {}
    for name, runner in runners.items():
        counter = OpCounter()
        with counter:
            runner(window=CountWindow(counter, warmup, steps))
        results[name] = per_step(counter.counts, steps)
    return results


def count_calls(runners: dict[str, Callable[..., StepCost]], warmup: int, steps: int) -> dict[str, Counter[str]]:
    """Per contender, Python calls per step by room (benchmarks/call_count.py), over `steps` steps after `warmup`."""
    results = {}
    for name, runner in runners.items():
        window = CallWindow(warmup, steps)
        runner(window=window)
        results[name] = window.calls_per_room()
    return results


def profile_ours(case: Case, compile_: bool, steps: int, warmup: int, top: int, **trainer_args: Any) -> str:
    """cProfile of our steady-state steps (from the warm-up's end to the end of the fit's training)."""
    profiler = cProfile.Profile()
    run_ours(case, compile_, steps, warmup, ProfileWindow(profiler, warmup), **trainer_args)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(CASES), default="linear")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model on both sides (inductor)")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[], metavar="KEY=VALUE",
                        help="also run ours with this Trainer argument (repeatable)")
    parser.add_argument("--set", type=parse_variant, action="append", default=[], metavar="KEY=VALUE",
                        help="a Trainer argument for every run of ours, variants included (repeatable)")
    parser.add_argument("--gpu-settings", action="store_true",
                        help="ours as benchmarks.gpu runs it: strategy=ddp, no logger/checkpoints/bar/summary, no self.log")
    parser.add_argument("--torch-ddp", action="store_true",
                        help="also run the plain loop with the model in torch DDP (one process)")
    parser.add_argument("--foreach", action="store_true", help="the optimizer's foreach implementation (CUDA's default)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N functions of a profile")
    parser.add_argument("--count-ops", type=int, default=0, metavar="N",
                        help="count each contender's would-be kernel launches over N steps instead of timing")
    parser.add_argument("--count-calls", type=int, default=0, metavar="N",
                        help="count each contender's Python calls per step, by module, over N steps instead of timing")
    parser.add_argument("--json", metavar="PATH", help="also write the figures (times or counts) to this file")
    return parser


def _contenders(args: argparse.Namespace, case: Case, base: dict[str, Any]) -> dict[str, Callable[..., StepCost]]:
    """Each contender as a call taking an optional `window`, so one set serves timing and counting."""
    counted = args.count_ops or args.count_calls
    steps = args.warmup + counted + 1 if counted else args.steps
    ours = functools.partial(run_ours, case, args.compile, steps, args.warmup, log_loss=not args.gpu_settings)
    runners: dict[str, Callable[..., StepCost]] = {
        "raw": functools.partial(run_raw, case, args.compile, steps, args.warmup),
        "ours": functools.partial(ours, **base),
    }
    if args.torch_ddp:
        runners["raw torch DDP"] = functools.partial(run_raw, case, args.compile, steps, args.warmup, True)
    for key, value in args.variant:
        runners[f"ours {key}={value!r}"] = functools.partial(ours, **{**base, key: value})
    return runners


def _report_times(times: dict[str, list[StepCost]]) -> None:
    for clock in StepCost._fields:
        print(f"{clock} time:")
        raw = statistics.median(getattr(cost, clock) for cost in times["raw"])
        for name, costs in times.items():
            values = [getattr(cost, clock) for cost in costs]
            median = statistics.median(values)
            paired = [value / getattr(raw_cost, clock) for value, raw_cost in zip(values, times["raw"])]
            print(f"{name:>28}: median {median * 1e3:.3f} ms/step (min {min(values) * 1e3:.3f}, max "
                  f"{max(values) * 1e3:.3f}); / raw {median / raw:.2f}x (paired {min(paired):.2f}-"
                  f"{max(paired):.2f}); overhead {(median - raw) * 1e3:.3f} ms/step")


def _plain(figures: dict[str, Any]) -> dict[str, Any]:
    """Times as {"wall": [...], "cpu": [...]} per contender (counts are plain already), for JSON."""
    return {name: {clock: [getattr(cost, clock) for cost in value] for clock in StepCost._fields}
            if isinstance(value, list) else value for name, value in figures.items()}


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.count_ops and args.compile:
        parser.error("--count-ops counts eager ops: compiled code does not dispatch them one by one; drop --compile")
    torch.set_num_threads(1)
    case = with_foreach(CASES[args.model]) if args.foreach else CASES[args.model]
    base = {"strategy": "ddp", **QUIET_TRAINER} if args.gpu_settings else {}
    base.update(args.set)
    runners = _contenders(args, case, base)
    print(f"model {args.model}{', compiled' if args.compile else ''}{', foreach optimizer' if args.foreach else ''}; "
          f"ours with {base or 'defaults'}{', no self.log' if args.gpu_settings else ''}")
    if args.count_ops:
        figures: dict[str, Any] = count_ops(runners, args.warmup, args.count_ops)
        print(f"kernel launches per step (ops a GPU would launch), over {args.count_ops} steps after {args.warmup}")
        print("\n".join(format_counts(figures)))
    elif args.count_calls:
        figures = count_calls(runners, args.warmup, args.count_calls)
        print(f"Python calls per step, over {args.count_calls} steps after {args.warmup}")
        print("\n".join(format_calls(figures)))
    else:
        run_ours(case, args.compile, args.warmup + 10, args.warmup, **base)  # first-use costs (imports, compiles) in no figure
        run_raw(case, args.compile, args.warmup + 10, args.warmup, args.torch_ddp)
        figures = measure(runners, args.rounds)
        print(f"{args.rounds} rounds of {args.steps} steps (ms/step from step {args.warmup} on)")
        _report_times(figures)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"argv": sys.argv[1:] if argv is None else argv, "figures": _plain(figures)}, out, indent=1)
    if args.profile:
        sys.stdout.write(profile_ours(case, args.compile, args.steps * 3, args.warmup, args.profile, **base))


if __name__ == "__main__":
    main()
