"""One fit-then-test run: `python -m benchmarks.contenders.stages_job --framework ours|lightning
--workload digits|digits_workers|mlp50m --out DIR [--epochs N] [--t0 T]`. Times `trainer.fit(...)` and the `trainer.test(...)`
after it in the launching process and prints one line, `STAGES_RESULT {json}` (global rank 0 only).

A real entry point: Lightning's "ddp" re-runs this command for rank 1. No class is defined here
(workers of our Trainer unpickle the module from `stages_ours`, not from `__main__`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import time

T_START = time.time()

RESULT_PREFIX = "STAGES_RESULT "
WORKLOADS = ("digits", "digits_workers", "mlp50m")
FRAMEWORKS = {"ours": "benchmarks.contenders.stages_ours", "lightning": "benchmarks.contenders.stages_pl"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=list(FRAMEWORKS), required=True)
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=None, help="digits: instead of the CLI's 10 (smoke runs)")
    parser.add_argument("--t0", type=float, default=None, help="time.time() when the harness started us")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    import torch

    from benchmarks.contenders.stages_parts import SEED

    jobs = importlib.import_module(FRAMEWORKS[args.framework])  # only the framework this run uses
    t0 = args.t0 if args.t0 is not None else T_START
    torch.manual_seed(SEED)
    trainer, module, fit_data, test_data = jobs.job(args.workload, args.out, args.epochs)
    fit_start = time.time()
    started = time.perf_counter()
    trainer.fit(module, **fit_data)
    fitted = time.perf_counter()
    tested = trainer.test(module, **test_data, verbose=False)
    done = time.perf_counter()
    if trainer.global_rank != 0:  # Lightning's rank 1, a re-run of this command
        return
    record = {"framework": args.framework, "workload": args.workload, "interpreter_to_main_s": T_START - t0,
              "startup_s": fit_start - t0, "fit_s": fitted - started, "test_s": done - fitted,
              "test_end_s": fit_start + (done - started) - t0,
              "test_metrics": {key: float(value) for key, value in (tested[0] if tested else {}).items()},
              "parameters": sum(parameter.numel() for parameter in module.parameters())}
    print(RESULT_PREFIX + json.dumps(record), flush=True)


if __name__ == "__main__":
    main(parse_args())
