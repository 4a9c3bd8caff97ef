"""`make bench-check` = `python -m benchmarks.check`: fail when our step got slower than it must be.

Run before committing any change to the reducer, the buckets, the comm hooks, the shared-memory transport or
the training step (#37: a reducer change counted only in GPU launches made our CPU step 1.5x slower, and
nothing timed it). Not part of `make test`, which never times anything.

What it runs: `benchmarks.run` on the communication-bound `mlp` and the balanced `gpt`, with torch DDP, ours
(our Trainer + DDPStrategy) and ours inside Lightning's Trainer (`pl_ours`), in interleaved rounds. Each
round gives paired ratios (ours / torch DDP, ours / pl_ours, same round), so a slow minute on a shared machine
hits both sides of a ratio alike.

When it fails: a comparison fails when the median of its paired ratios is below its floor by more than the
noise the run itself measured, that is half the range of the same ratio across rounds (at least 2 %):

    median(ratio) < floor * (1 - max(0.02, (max(ratio) - min(ratio)) / 2))

Floors: ours >= torch DDP and ours >= ours-inside-Lightning on both workloads (the same reducer, so our
Trainer must cost no more than Lightning's loop around it), and on `mlp` ours >= 1.3x torch DDP: the lead the
shared-memory transport and the one-pass copy-in buy, which a reducer regression gives back first (it slows
`pl_ours` too, so the pl_ours comparison alone would not see it). Run it on an otherwise idle machine: it
prints the load before and after, and a noisy run widens its own tolerance rather than failing at random.

    python -m benchmarks.check                       # 3 rounds, about 5 minutes on 2 idle cores
    python -m benchmarks.check --repeats 5 --out /tmp/bench-check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import run as harness

WORKLOADS = ("mlp", "gpt")
CONTENDERS = ("torch_ddp", "ours", "pl_ours")
MIN_NOISE = 0.02


@dataclass(frozen=True)
class Floor:
    """`ours` / `against` must be at least `ratio` on `workload`, beyond the noise."""

    workload: str
    against: str
    ratio: float


FLOORS = (
    Floor("mlp", "torch_ddp", 1.3), Floor("mlp", "pl_ours", 1.0),
    Floor("gpt", "torch_ddp", 1.0), Floor("gpt", "pl_ours", 1.0),
)


def paired_ratios(runs: list[dict[str, Any]], workload: str, top: str, bottom: str) -> list[float]:
    """samples/s of `top` over `bottom` in each round both finished, in round order."""
    def by_round(contender: str) -> dict[int, float]:
        return {run["repeat"]: run["samples_per_s"] for run in runs
                if run["workload"] == workload and run["contender"] == contender and "error" not in run}
    tops, bottoms = by_round(top), by_round(bottom)
    return [tops[index] / bottoms[index] for index in sorted(tops) if index in bottoms and bottoms[index]]


@dataclass(frozen=True)
class Verdict:
    floor: Floor
    ratios: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def noise(self) -> float:
        """Half the rounds' range of this ratio: how far one round may stray from another here, today."""
        return max(MIN_NOISE, (max(self.ratios) - min(self.ratios)) / 2)

    @property
    def passed(self) -> bool:
        return self.median >= self.floor.ratio * (1 - self.noise)

    def line(self) -> str:
        spread = ", ".join(f"{ratio:.3f}" for ratio in self.ratios)
        word = "ok  " if self.passed else "FAIL"
        return (f"{word} {self.floor.workload}: ours / {self.floor.against} = {self.median:.3f} "
                f"(rounds: {spread}; noise ±{self.noise:.1%}); floor {self.floor.ratio:.2f}, "
                f"fails below {self.floor.ratio * (1 - self.noise):.3f}")


def judge(runs: list[dict[str, Any]], floors: tuple[Floor, ...] = FLOORS) -> list[Verdict]:
    """One verdict per floor; a floor whose contenders produced no paired round fails outright."""
    verdicts = []
    for floor in floors:
        ratios = paired_ratios(runs, floor.workload, "ours", floor.against)
        if not ratios:
            raise SystemExit(f"bench-check: no round where both ours and {floor.against} finished on "
                             f"{floor.workload}; see the runs' errors above.")
        verdicts.append(Verdict(floor, ratios))
    return verdicts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--out", default=str(harness.RESULTS / "bench_check"), help="where results.json goes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = harness.main(["--workloads", ",".join(WORKLOADS), "--contenders", ",".join(CONTENDERS),
                            "--repeats", str(args.repeats), "--launch-repeats", "0", "--no-sweep",
                            "--no-accuracy", "--out", args.out])
    verdicts = judge(results["runs"])
    load = results["meta"]["load_before"][0], results["meta"]["load_after"][0]
    report = [verdict.line() for verdict in verdicts]
    print(f"\nbench-check ({args.repeats} rounds, load {load[0]:.2f} before, {load[1]:.2f} after, "
          f"{os.cpu_count()} cores):", *report, sep="\n")
    (Path(args.out) / "check.json").write_text(json.dumps(
        {"load": load, "verdicts": [{"workload": v.floor.workload, "against": v.floor.against,
                                     "floor": v.floor.ratio, "median": v.median, "ratios": v.ratios,
                                     "noise": v.noise, "passed": v.passed} for v in verdicts]}, indent=1))
    return 0 if all(verdict.passed for verdict in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
