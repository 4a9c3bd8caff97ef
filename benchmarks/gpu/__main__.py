"""`python -m benchmarks.gpu --out DIR`: every contender, eager and compiled, on the three GPU workloads.

    python -m benchmarks.gpu --out benchmarks/results/gpu_h100            # on one GPU, ~8 minutes
    python -m benchmarks.gpu --smoke --out /tmp/gpu-smoke                  # on the CPU, toy sizes, seconds
    python -m benchmarks.gpu --workloads gpt --modes compiled --out /tmp/g  # one phase

Writes `results.json` (every window, round and probe) and `results.md` (tables and targets) to
`--out` after every phase, and a `contenders.log` with what the contenders' libraries printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu import summary
from benchmarks.gpu.coordinator import Settings, run_phases
from benchmarks.gpu.models import WORKLOAD_NAMES, workloads

CONTENDER_LOOPS = {"plain": "plain", "torch_ddp": "torch_ddp", "lightning": "lightning", "ours": "ours",
                   "ours_again": "ours"}  # ours twice: the two must agree within the protocol's resolution
MODES = ("eager", "compiled")


def _names(text: str, known: tuple[str, ...] | dict[str, Any], flag: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise SystemExit(f"{flag}: unknown {unknown or text!r}; expected a comma-separated subset of {list(known)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for results.json, results.md and contenders.log")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU: checks the command, not speed")
    parser.add_argument("--workloads", default=",".join(WORKLOAD_NAMES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--contenders", default=",".join(CONTENDER_LOOPS))
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 6; smoke 2)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="the whole run's seconds, compiles included (default 480; smoke 120)")
    parser.add_argument("--precision", choices=("bf16-mixed", "32-true"), default=None,
                        help="default bf16-mixed on a GPU, 32-true with --smoke")
    args = parser.parse_args(argv)
    args.workloads = _names(args.workloads, WORKLOAD_NAMES, "--workloads")
    args.modes = _names(args.modes, MODES, "--modes")
    args.contenders = _names(args.contenders, CONTENDER_LOOPS, "--contenders")
    args.rounds = args.rounds or (2 if args.smoke else 6)
    args.budget_s = args.budget_s or (120.0 if args.smoke else 480.0)
    if args.rounds < 1 or args.budget_s <= 0:
        raise SystemExit(f"--rounds and --budget-s must be positive, got {args.rounds} and {args.budget_s}")
    return args


def settings_for(args: argparse.Namespace) -> Settings:
    import torch

    if args.smoke:
        return Settings("cpu", args.precision or "32-true", True, args.rounds, args.budget_s, min_steps=6,
                        min_s=0.0, max_s=0.3, window_s=0.01, max_settle_s=0.2, host_steps=2,
                        profile_steps=2)
    if not torch.cuda.is_available():
        raise SystemExit("python -m benchmarks.gpu: no CUDA device is visible; --smoke runs the toy sizes on the CPU")
    return Settings("cuda", args.precision or "bf16-mixed", False, args.rounds, args.budget_s)


def _meta(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    import torch

    from benchmarks.run import _version

    return {"command": "python -m benchmarks.gpu " + " ".join(sys.argv[1:] if argv is None else argv),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
            "pytorch_lightning": _version("pytorch_lightning"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.smoke else "CPU (smoke)",
            "rounds": args.rounds, "budget_s": args.budget_s}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings = settings_for(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = workloads(args.smoke)
    kinds = {name: work.kind for name, work in table.items()}
    results: dict[str, Any] = {"meta": {**_meta(args, argv), "precision": settings.precision}, "phases": []}
    started = time.monotonic()

    def write(phases: list[dict[str, Any]]) -> None:
        for phase in phases:
            if "contenders" in phase and "summary" not in phase:
                phase["summary"] = summary.summarize(phase, table[phase["workload"]].batch_size)
        results["phases"] = phases
        results["meta"]["took_s"] = time.monotonic() - started
        results["targets"] = summary.targets(phases, kinds)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "results.md").write_text(summary.markdown(results))

    phases = [(workload, mode) for workload in args.workloads for mode in args.modes]
    loops = {name: CONTENDER_LOOPS[name] for name in args.contenders}
    run_phases(loops, phases, settings, out / "contenders.log", write)
    print((out / "results.md").read_text())
    return results


if __name__ == "__main__":
    main()
