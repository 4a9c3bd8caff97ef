"""Our Trainer, our strategy inside Lightning's Trainer, and torch DDP, taking turns in the same two ranks (#37).

`benchmarks.run` starts every contender as its own process tree, which is what an outsider measures, but on a
shared 2-core VM two runs of the same contender differ by 10-20 %: too much to tell whether our Trainer costs
more per step than Lightning's loop around the same DDP strategy (the two differ by a few milliseconds of
Python in a 100 ms step). Here two CPU ranks are started once, with torchrun's environment, and each round
fits every contender in them, one after another, in a rotated order: the same processes, threads, memory and
process group, so what differs between two fits of a round is the contender. Each fit is the contender's own
code (`benchmarks/contenders/`), trained on the same batches; rank 0's steady-state samples/s give one paired
ratio per round, and the medians with their range are reported.

    python -m benchmarks.loop_ab --workload mlp --rounds 6
    python -m benchmarks.loop_ab --workload gpt --rounds 6 --steps 20
    python -m benchmarks.loop_ab --workload gpt --contenders ours,ours:bucket_cap_mb=8,ours:telemetry=off

`ours:KEY=VALUE` is our contender with one of its options changed (`--bucket-cap-mb`, `--comm-hook`,
`--on-nonfinite`, `--telemetry`, ...): what one setting costs, measured the same way.

What this does not measure: launch, imports, memory, and anything a contender does once per process. Torch
DDP runs in processes our strategy has already tuned (CPU ranks keep the memory they free:
strategies/cpu_memory.py), so its step is as fast here as it can be and ours / torch DDP reads lower than in
separate processes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.allreduce_model import free_port
from benchmarks.contenders import ours, pl_ours, torch_ddp
from benchmarks.probe import parse_args, throughput
from benchmarks.run import RESULTS, STEPS
from benchmarks.workloads import WORKLOADS
from strategies.cpu_memory import keep_freed_memory
from strategies.worker import cpu_threads_per_rank

RANKS = 2
_OURS_OPTIONS = {"comm_hook": str, "bucket_cap_mb": str, "transport": str, "zero_stage": str, "on_nonfinite": str,
                 "telemetry": str}  # the `ours` contender's own command-line options


def _fit_ours(args: argparse.Namespace) -> None:
    ours.main(args)


def _fit_pl_ours(args: argparse.Namespace) -> None:
    pl_ours.main(args)


def _fit_torch_ddp(args: argparse.Namespace) -> None:
    torch_ddp.train(args, dist.get_rank(), torch.device("cpu"))


FITS: dict[str, Callable[[argparse.Namespace], None]] = {
    "ours": _fit_ours, "pl_ours": _fit_pl_ours, "torch_ddp": _fit_torch_ddp}


def _torchrun_environment(rank: int, port: int) -> dict[str, str]:
    """What torchrun sets for a rank: both Trainers then join the job instead of launching their own ranks."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "WORLD_SIZE": str(RANKS),
            "LOCAL_WORLD_SIZE": str(RANKS), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": "loop_ab"}


def settle_rank(rank: int, port: int) -> None:
    """This process as a torchrun rank of the job, with its share of the cores in OMP_NUM_THREADS too (as
    benchmarks.stages sets it): without it, Lightning's launcher would give the ranks their share at the first
    pl_ours fit, so the fits before it ran at another thread count than every fit after it."""
    threads = cpu_threads_per_rank(RANKS)  # each rank's share, as benchmarks.run's contenders take it
    os.environ.update(_torchrun_environment(rank, port), OMP_NUM_THREADS=str(threads))
    torch.set_num_threads(threads)


def _join_the_job() -> None:
    """The process group every fit runs in, made before the first fit, as torchrun's script or the hand-written
    torch DDP would: torch DDP may come first, and both Trainers join a group that exists. The allocator is set
    as our strategy sets it, so every fit, the first included, runs in the same tuned processes."""
    keep_freed_memory()
    dist.init_process_group("gloo", init_method="env://")
    dist.barrier()  # gloo's init returns once this rank's connections are up, not its peer's


def _rank(rank: int, port: int, options: argparse.Namespace, scratch: str) -> None:
    settle_rank(rank, port)
    _join_the_job()
    warnings.simplefilter("ignore")  # as benchmarks.run's contenders run (PYTHONWARNINGS=ignore)
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # its banner on every fit of every round
    for round_index in range(options.rounds):
        shift = round_index % len(options.contenders)
        for name in options.contenders[shift:] + options.contenders[:shift]:
            out = Path(scratch, str(round_index), name)
            base, changed = split_contender(name)
            argv = ["--workload", options.workload, "--warmup", str(options.warmup), "--steps", str(options.steps),
                    "--devices", str(RANKS), "--out", str(out), *changed]
            FITS[base](parse_args(argv, **_OURS_OPTIONS))
            if rank == 0:
                print(f"  round {round_index} {name:9s} {_samples_per_s(out):8.1f} samples/s "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


def split_contender(name: str) -> tuple[str, list[str]]:
    """`ours:bucket_cap_mb=8` -> ("ours", ["--bucket-cap-mb", "8"]); a plain name has no options."""
    base, _, option = name.partition(":")
    if not option:
        return base, []
    key, equals, value = option.partition("=")
    if base != "ours" or not equals or key not in _OURS_OPTIONS:
        raise ValueError(f"contender {name!r}: only ours takes an option, as ours:KEY=VALUE with KEY one of "
                         f"{sorted(_OURS_OPTIONS)}")
    return base, [f"--{key.replace('_', '-')}", value]


def _samples_per_s(out: Path) -> float:
    return throughput(json.loads((out / "rank0.json").read_text()), RANKS)


def paired(samples: dict[str, list[float]], top: str, bottom: str) -> list[float]:
    """`top` / `bottom` samples/s in each round."""
    return [a / b for a, b in zip(samples[top], samples[bottom], strict=True)]


def summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    """Medians and ranges of the first contender against every other one, round by round."""
    result: dict[str, Any] = {"samples_per_s": samples}
    first, *others = samples
    for other in others:
        ratios = paired(samples, first, other)
        result[f"{first} / {other}"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                         "rounds": ratios}
    return result


def run(options: argparse.Namespace) -> dict[str, Any]:
    """Start the two ranks, take the rounds, and read back rank 0's samples/s of every fit."""
    with tempfile.TemporaryDirectory(prefix="loop-ab-") as scratch:
        mp.spawn(_rank, args=(free_port(), options, scratch), nprocs=RANKS)
        samples = {name: [_samples_per_s(Path(scratch, str(index), name)) for index in range(options.rounds)]
                   for name in options.contenders}
    return {"workload": options.workload, "rounds": options.rounds, "warmup": options.warmup, "steps": options.steps,
            **summary(samples)}


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=None, help="per fit (default: benchmarks.run's)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per fit (default: benchmarks.run's)")
    parser.add_argument("--contenders", default=",".join(FITS), help=f"a comma-separated subset of {list(FITS)}")
    parser.add_argument("--out", default=None, help="results.json goes here (default: results/loop_ab_<workload>)")
    options = parser.parse_args(argv)
    options.contenders = [name for name in options.contenders.split(",") if name]
    try:
        unknown = [name for name in options.contenders if split_contender(name)[0] not in FITS]
    except ValueError as error:
        parser.error(f"--contenders: {error}")
    if unknown or not options.contenders:
        parser.error(f"--contenders: unknown {unknown or options.contenders}; expected names from {list(FITS)} "
                     "(or ours:KEY=VALUE)")
    if len(set(options.contenders)) != len(options.contenders):
        parser.error(f"--contenders: each contender once; {options.contenders} are not distinct")
    if options.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {options.rounds}")
    warmup, steps = STEPS[options.workload]
    options.warmup = warmup if options.warmup is None else options.warmup
    options.steps = steps if options.steps is None else options.steps
    if options.warmup < 1 or options.steps < 1:
        parser.error(f"--warmup and --steps must be at least 1, got {options.warmup} and {options.steps}")
    return options


def report(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['workload']}, {result['rounds']} rounds of {result['steps']} steps, same two ranks:"]
    for key, value in result.items():
        if " / " in key:
            rounds = ", ".join(f"{ratio:.3f}" for ratio in value["rounds"])
            lines.append(f"  {key} = {value['median']:.3f} (rounds: {rounds})")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    options = parse_options(argv)
    result = run(options)
    out = Path(options.out) if options.out else RESULTS / f"loop_ab_{options.workload}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(*report(result), sep="\n")
    return result


if __name__ == "__main__":
    main()
