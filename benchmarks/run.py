"""`make bench` = `python -m benchmarks.run`: every contender on every workload, interleaved.

Each run is a fresh process tree (so launch cost and memory are measured, not shared). Repeats
are interleaved, round-robin with the contender order rotated each round, so a slow minute on
a shared machine hits every contender alike; results are medians with min-max.

    python -m benchmarks.run                 # full: 3 workloads x 7 contenders x 5 repeats, launch-only
                                             # rounds, sweep, accuracy
    python -m benchmarks.run --quick         # smoke: 1 repeat, a few steps, no sweep/accuracy
    python -m benchmarks.run --quick --workloads cnn --contenders single,ours --steps 2 --out /tmp/b
    python -m benchmarks.run --accelerator cuda --precision bf16-mixed --batch-size 64 --out /tmp/gpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.code_roots import packages_of
from benchmarks.contenders import ALL_CONTENDERS, BASELINE, CONTENDERS, Contender
from benchmarks.probe import throughput
from benchmarks.workloads import DEFAULT_WORKLOADS, WORKLOADS

RESULTS = Path(__file__).parent / "results"
DOCS_RESULTS = Path(__file__).parents[1] / "docs" / "results.md"
STEPS = {"mlp": (10, 40), "gpt": (5, 20), "cnn": (5, 20), "gpt_host": (30, 300)}  # (warm-up, measured) per workload
QUICK_STEPS = (1, 2)
LAUNCH_PAIR = (BASELINE, "ours")  # the launch targets compare these two
SWEEP_CAPS = ("1", "2", "4", "8", "16", "25", "64", "auto")


@dataclass(frozen=True)
class Placement:
    """Where and how every contender of one harness run trains: the same for all of them."""

    accelerator: str = "cpu"
    devices: int = 2  # ranks of the DDP contenders (the single process is always one)
    precision: str = "32-true"
    batch_size: int | None = None  # per rank; None: the workload's own

    def flags(self, ranks: int) -> list[str]:
        batch = ["--batch-size", str(self.batch_size)] if self.batch_size else []
        return ["--devices", str(ranks), "--accelerator", self.accelerator, "--precision", self.precision, *batch]

    def batch(self, workload: str) -> int:
        return self.batch_size or WORKLOADS[workload].batch_size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 repeat, few steps, no sweep or accuracy runs")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 5; quick 1)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="measured steps per run")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=None,
                        help="bucket-size sweep of ours on the comm-bound workload (default: on unless --quick)")
    parser.add_argument("--launch-repeats", type=int, default=None,
                        help="extra launch-only rounds (torch DDP vs ours, 1 step each) per workload, which the "
                             "launch targets are judged on (default 10; 0 with --quick)")
    parser.add_argument("--accuracy", action=argparse.BooleanOptionalAction, default=None,
                        help="digits val_acc with fp32 vs bf16 communication, always on 2 CPU ranks "
                             "(default: on unless --quick or --accelerator cuda)")
    parser.add_argument("--docs", default=None, help=f"also write the README section here (default: {DOCS_RESULTS} "
                                                      "for a full run into the default --out)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per contender run")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: every contender on GPUs, nccl between the DDP ranks")
    parser.add_argument("--devices", type=int, default=None,
                        help="ranks of the DDP contenders (default 2 on cpu, every visible GPU on cuda)")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    parser.add_argument("--batch-size", type=int, default=None, help="per rank (default: each workload's own)")
    parser.add_argument("--baseline-root", default=None,
                        help="another checkout: contenders named NAME@base run its trainer/strategies "
                             "(before/after figures), e.g. --contenders ours,ours@base")
    args = parser.parse_args(argv)
    args.workloads = _names(args.workloads, WORKLOADS, "--workloads")
    known = {**ALL_CONTENDERS,
             **({f"{name}@base": c for name, c in ALL_CONTENDERS.items()} if args.baseline_root else {})}
    args.contenders = _names(args.contenders, known, "--contenders")
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.sweep = (not args.quick) if args.sweep is None else args.sweep
    args.accuracy = (not args.quick and args.accelerator == "cpu") if args.accuracy is None else args.accuracy
    args.launch_repeats = (0 if args.quick else 10) if args.launch_repeats is None else args.launch_repeats
    args.placement = _placement(args)
    if args.docs is None and not args.quick and Path(args.out).resolve() == RESULTS.resolve():
        args.docs = str(DOCS_RESULTS)  # only the canonical full run rewrites the README section
    return args


def _placement(args: argparse.Namespace) -> Placement:
    devices = args.devices
    if args.accelerator == "cuda":
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible == 0:
            raise SystemExit("--accelerator cuda: no CUDA device is visible; use --accelerator cpu")
        devices = devices or visible
        if devices > visible:
            raise SystemExit(f"--devices {devices}: only {visible} CUDA device(s) are visible")
    devices = devices or 2
    if devices < 1 or (args.batch_size is not None and args.batch_size < 1):
        raise SystemExit(f"--devices and --batch-size must be >= 1, got {devices} and {args.batch_size}")
    return Placement(args.accelerator, devices, args.precision, args.batch_size)


def _names(text: str, known: dict[str, Any], flag: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise SystemExit(f"{flag}: unknown {unknown or text!r}; expected a comma-separated subset of {list(known)}")
    return names


def steps_for(workload: str, args: argparse.Namespace) -> tuple[int, int]:
    warmup, steps = QUICK_STEPS if args.quick else STEPS[workload]
    return (args.warmup if args.warmup is not None else warmup), (args.steps if args.steps is not None else steps)


# ---------------------------------------------------------------------- one run
def run_contender(contender: Contender, workload: str, warmup: int, steps: int, timeout: float,
                  options: dict[str, str] | None = None, code_root: str | None = None,
                  name: str | None = None, placement: Placement = Placement()) -> dict[str, Any]:
    """Start the contender's process tree, wait, and read back what each rank wrote."""
    options = {**contender.options, **(options or {})}
    ranks = placement.devices if contender.distributed else 1
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-"))
        # Another checkout's packages go first, and the process starts outside this checkout
        # (`python -m` would put its `trainer` and `strategies` ahead of PYTHONPATH's).
        shim = str(stack.enter_context(packages_of(Path(code_root)))) if code_root else None
        cwd = out if code_root else Path(__file__).parents[1]
        command = [sys.executable, "-m", contender.module, "--workload", workload, "--warmup", str(warmup),
                   "--steps", str(steps), *placement.flags(ranks), "--out", out]
        command += [item for key, value in options.items() for item in (f"--{key.replace('_', '-')}", value)]
        t0 = time.time()
        done = subprocess.run([*command, "--t0", repr(t0)], capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, env=_child_env(shim))
        wall = time.time() - t0
        records = [json.loads(path.read_text()) for path in sorted(Path(out).glob("rank*.json"))]
    run: dict[str, Any] = {"workload": workload, "contender": name or contender.name, "options": options,
                           "returncode": done.returncode, "wall_s": wall, "ranks": records}
    if done.returncode != 0 or len(records) != ranks:
        run["error"] = (done.stderr or done.stdout)[-3000:]
        return run
    rank0 = min(records, key=lambda record: record["rank"])
    run.update(samples_per_s=throughput(rank0, ranks),  # by the batch the contender trained on
               launch_to_first_step_s=rank0["launch_to_first_step_s"],
               peak_rss_mib=max(record["peak_rss_mib"] for record in records),
               final_loss=rank0["final_loss"], reducer=rank0.get("reducer"), telemetry=rank0.get("telemetry"))
    return run


def _child_env(code_root: str | None = None) -> dict[str, str]:
    """The contenders import this checkout, or `code_root`'s `trainer` and `strategies` first
    (the `@base` contenders of --baseline-root; `benchmarks` still comes from here)."""
    env = dict(os.environ)
    roots = [code_root, str(Path(__file__).parents[1]), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, roots))
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def interleaved(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Round-robin over workloads and contenders, rotating the contender order every round."""
    runs = []
    for repeat in range(args.repeats):
        order = args.contenders[repeat % len(args.contenders):] + args.contenders[:repeat % len(args.contenders)]
        for workload in args.workloads:
            warmup, steps = steps_for(workload, args)
            for name in order:
                base, _, tag = name.partition("@")
                run = run_contender(ALL_CONTENDERS[base], workload, warmup, steps, args.timeout, name=name,
                                    code_root=args.baseline_root if tag else None, placement=args.placement)
                run["repeat"] = repeat
                runs.append(run)
                _progress(run)
    return runs


def _progress(run: dict[str, Any]) -> None:
    if "error" in run:
        print(f"  {run['workload']:4s} {run['contender']:10s} FAILED (exit {run['returncode']})", flush=True)
        return
    print(f"  {run['workload']:4s} {run['contender']:10s} {json.dumps(run.get('options') or {}):24s} "
          f"{run['samples_per_s']:9.1f} samples/s  launch {run['launch_to_first_step_s']:5.2f} s  "
          f"rss {run['peak_rss_mib']:6.0f} MiB  (load {os.getloadavg()[0]:.2f})", flush=True)


def launch_only(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Launch -> first step needs many repeats, not many steps: it varies ±20 % from run to run
    here (interpreter start and imports compete with whatever else the machine runs), so a
    launch target judged on the few throughput rounds is a coin toss. Each run here stops after
    its second step; pairs alternate their order every round."""
    runs = []
    for repeat in range(args.launch_repeats):
        for workload in args.workloads:
            for name in LAUNCH_PAIR if repeat % 2 == 0 else LAUNCH_PAIR[::-1]:
                run = run_contender(ALL_CONTENDERS[name], workload, 1, 1, args.timeout, placement=args.placement)
                run["repeat"] = repeat
                runs.append(run)
                if "error" in run:
                    _progress(run)
    return runs


# ---------------------------------------------------------------------- sweep and accuracy
def bucket_sweep(args: argparse.Namespace, workload: str = "mlp") -> dict[str, Any]:
    """Ours on the comm-bound workload for several bucket caps (and "auto"), torch DDP as reference."""
    warmup, steps = steps_for(workload, args)
    warmup = max(warmup, 20)  # "auto" measures during its first steps: keep them out of the timing
    runs = []
    for repeat in range(max(1, args.repeats - 2)):
        for cap in (*SWEEP_CAPS, "torch_ddp"):
            contender = CONTENDERS["torch_ddp" if cap == "torch_ddp" else "ours"]
            options = {} if cap == "torch_ddp" else {"bucket_cap_mb": cap}
            run = run_contender(contender, workload, warmup, steps, args.timeout, options, placement=args.placement)
            run.update(repeat=repeat, cap=cap)
            runs.append(run)
            _progress(run)
    return {"workload": workload, "caps": list(SWEEP_CAPS), "warmup": warmup, "steps": steps, "runs": runs}


def digits_accuracy(seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    """`ddp-train` on digits (2 ranks, 10 epochs) with fp32 and bf16 communication: final val_acc."""
    results: dict[str, Any] = {"seeds": list(seeds), "val_acc": {"fp32": [], "bf16": []}}
    for seed in seeds:
        for name, hook in (("fp32", "null"), ("bf16", "bf16")):
            with tempfile.TemporaryDirectory(prefix="bench-acc-") as out:
                command = [sys.executable, "-m", "trainer", f"strategy.comm_hook={hook}", f"seed={seed}", "logger=csv",
                           "callbacks=none", "trainer.enable_progress_bar=false", f"hydra.run.dir={out}"]
                done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                                      cwd=Path(__file__).parents[1], env=_child_env())
                results["val_acc"][name].append(_last_val_acc(Path(out)) if done.returncode == 0 else None)
                if done.returncode != 0:
                    results.setdefault("errors", []).append(done.stderr[-2000:])
    results["command"] = "ddp-train strategy.comm_hook={null,bf16} seed={0,1,2} logger=csv callbacks=none"
    return results


def _last_val_acc(run_dir: Path) -> float | None:
    import csv

    value = None
    for path in run_dir.rglob("metrics.csv"):
        with path.open() as handle:
            for row in csv.DictReader(handle):
                if row.get("val_acc"):
                    value = float(row["val_acc"])
    return value


# ---------------------------------------------------------------------- main
def machine() -> dict[str, Any]:
    import torch

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "torch": torch.__version__, "pytorch_lightning": _version("pytorch_lightning"),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "platform": platform.platform()}


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": os.getloadavg(), **machine(),
            "repeats": args.repeats, "launch_repeats": args.launch_repeats,
            "steps": {w: steps_for(w, args) for w in args.workloads},
            "batch_per_rank": {w: args.placement.batch(w) for w in args.workloads},
            "accelerator": args.placement.accelerator, "ranks": args.placement.devices,
            "precision": args.placement.precision}
    print(f"benchmark: {meta['command']}  (load {meta['load_before'][0]:.2f}, {meta['cores']} cores)", flush=True)
    results: dict[str, Any] = {"meta": meta, "runs": interleaved(args)}
    if args.launch_repeats and set(LAUNCH_PAIR) <= set(args.contenders):
        results["launch_runs"] = launch_only(args)
        results["launch"] = report.summarize(results["launch_runs"])
        print(report.render_launch(results), flush=True)
    if args.accuracy:
        results["accuracy"] = digits_accuracy()
    if args.sweep:
        sweep = bucket_sweep(args)
        (out / "sweep.json").write_text(json.dumps(sweep, indent=1))
        report.plot_sweep(sweep, out / "sweep.png")
        results["sweep"] = report.summarize_sweep(sweep)
    meta["load_after"] = os.getloadavg()
    results["summary"] = report.summarize(results["runs"])
    results["targets"] = report.targets(results["summary"], results.get("accuracy"), results.get("launch"))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(report.render_markdown(results))
    report.plot_results(results, out / "results.png")
    if args.docs:
        Path(args.docs).write_text(report.render_readme_section(results))
    print(report.render_table(results))
    return results


if __name__ == "__main__":
    main()
