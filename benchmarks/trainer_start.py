"""What a new Trainer costs once the process has ranks (#36, item 2), against Lightning, interleaved.

    python -m benchmarks.trainer_start                       # 3 rounds of every scenario
    python -m benchmarks.trainer_start --rounds 5 --scenarios three,notebook --out benchmarks/results/trainer_start

Scenarios, each run a fresh process tree per round, contenders' order rotated every round:

* `three`: tests/conformance/three_trainers_script.py, a script fitting three small models with three
  Trainers (`strategy="ddp"`, 2 CPU ranks): the 2nd and 3rd fits together, ours against
  `pytorch_lightning`'s `ddp` (whose rank 1 re-runs the script once and serves every Trainer).
* `notebook`: benchmarks/contenders/new_trainer_fits.py, "new Trainer, fit one epoch" 5 times in one
  process with `strategy="ddp_notebook"`: the first fit and the median of the others, ours against
  `pytorch_lightning`'s `ddp_notebook` (a plain script stands in for the kernel).
* `multirun`: `ddp-train -m seed=1,2,3,4` (Hydra's basic launcher: 4 jobs one after the other in one
  process, each its own Trainer; benchmarks/contenders/multirun_jobs.py) against the same 4 jobs as fits
  of ONE Trainer (benchmarks/contenders/multirun_reuse.py), each fit training the same steps (checked):
  the first job's fit, and of jobs 2-4 the median fit (the span the CLI's "finished in" prints) and the
  median whole job (seed, build, fit; the CLI's validation and summary too).

Ours runs with the process's default ranks: forked per stage where forking is safe (one CPU thread per
rank, as on this 2-core machine), else the shared pool; `--threads 2` forces the pool (OMP_NUM_THREADS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MULTIRUN = ["trainer.max_epochs=1", "logger=none", "callbacks=none", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "trainer.num_sanity_val_steps=0"]


def _python(args: list[str], cwd: Path, threads: str | None) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def three(contender: str, work: Path, threads: str | None) -> dict[str, float]:
    kind = {"ours": "ours", "pl_ddp": "pytorch_lightning"}[contender]
    _python(["-m", "tests.conformance.three_trainers_script", kind, str(work)], REPO, threads)
    fits = json.loads(Path(work, "fits.json").read_text())
    seconds = [fits[width]["seconds"] for width in ("4", "8", "16")]
    return {"first_s": seconds[0], "second_and_third_s": seconds[1] + seconds[2]}


def notebook(contender: str, work: Path, threads: str | None) -> dict[str, float]:
    kind = {"ours": "ours", "pl_notebook": "pl_notebook"}[contender]
    out = work / "fits.json"
    _python(["-m", "benchmarks.contenders.new_trainer_fits", kind, "5", str(out)], REPO, threads)
    seconds = json.loads(out.read_text())["seconds"]
    return {"first_s": seconds[0], "later_median_s": statistics.median(seconds[1:])}


def multirun(contender: str, work: Path, threads: str | None) -> dict[str, float]:
    out = work / "jobs.json"
    if contender == "ours_multirun":
        _python(["-m", "benchmarks.contenders.multirun_jobs", str(out), "-m", "seed=1,2,3,4",
                 f"hydra.sweep.dir={work}", *MULTIRUN], work, threads)
    else:
        _python(["-m", "benchmarks.contenders.multirun_reuse", str(out), f"paths.output_dir={work}", *MULTIRUN],
                work, threads)
    clocks = json.loads(out.read_text())
    if len(clocks["seconds"]) != 4 or len(set(clocks["steps"])) != 1 or not clocks["steps"][0]:
        raise RuntimeError(f"{contender}: expected 4 jobs of the same nonzero steps, got {clocks}")
    return {"first_s": clocks["seconds"][0], "jobs_2_to_4_median_s": statistics.median(clocks["seconds"][1:]),
            "jobs_2_to_4_whole_median_s": statistics.median(clocks["job_seconds"][1:])}


SCENARIOS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "three": (three, ("ours", "pl_ddp")),
    "notebook": (notebook, ("ours", "pl_notebook")),
    "multirun": (multirun, ("ours_multirun", "ours_one_trainer")),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", default="three,notebook,multirun")
    parser.add_argument("--threads", default=None, help="OMP_NUM_THREADS for every contender (2: ours uses its pool)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        for name in args.scenarios.split(","):
            measure, contenders = SCENARIOS[name]
            order = contenders if round_index % 2 == 0 else tuple(reversed(contenders))
            for contender in order:
                with tempfile.TemporaryDirectory(prefix="trainer-start-") as work:
                    load = os.getloadavg()[0]
                    started = time.perf_counter()
                    try:
                        figures = measure(contender, Path(work), args.threads)
                    except (RuntimeError, subprocess.TimeoutExpired) as error:  # recorded, the other runs go on
                        print(f"{name}/{contender} failed: {error}", file=sys.stderr, flush=True)
                        continue
                    runs.append({"scenario": name, "contender": contender, "round": round_index, "load1": load,
                                 "wall_s": time.perf_counter() - started, **figures})
                    print(json.dumps(runs[-1]), flush=True)
    table = _table(runs)
    print(table)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "runs.json").write_text(json.dumps(runs, indent=1))
        Path(args.out, "table.md").write_text(table + "\n")


def _table(runs: list[dict[str, Any]]) -> str:
    lines = ["| scenario | contender | figure | median (s) | min–max (s) | rounds | load (1 min) |", "|---|---|---|---|---|---|---|"]
    for scenario, (_, contenders) in SCENARIOS.items():
        for contender in contenders:
            mine = [run for run in runs if run["scenario"] == scenario and run["contender"] == contender]
            if not mine:
                continue
            figures = [key for key in mine[0] if key.endswith("_s") and key != "wall_s"]
            loads = [run["load1"] for run in mine]
            for figure in figures:
                values = [run[figure] for run in mine]
                lines.append(f"| {scenario} | {contender} | {figure} | {statistics.median(values):.2f} | "
                             f"{min(values):.2f}–{max(values):.2f} | {len(values)} | {min(loads):.1f}–{max(loads):.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
