"""`python -m benchmarks.contenders.multirun_jobs OUT_JSON ARG...`: `ddp-train ARG...` (a `-m` sweep: Hydra's
basic launcher runs the jobs one after the other in this process, each with its own Trainer), with each
job's clocks written to OUT_JSON as benchmarks/contenders/multirun_reuse.py writes them:

* `seconds`: each job's `Trainer.fit`, the span the CLI's "finished in" line prints (rounded to 0.1 s there);
* `job_seconds`: each job as the CLI runs it (validate, seed, build, fit, summary), Hydra's own per-job
  work (the job's directory, `.hydra/`, logging) excluded;
* `steps`: the optimizer steps each fit took, so that a comparison can check both did the same work.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import trainer.cli.command as command
from trainer import Trainer


def main(out: str, argv: list[str]) -> None:
    clocks: dict[str, list[float]] = {"seconds": [], "job_seconds": [], "steps": []}
    fit, run = Trainer.fit, command.run

    def timed_fit(self: Trainer, *args: Any, **kwargs: Any) -> None:
        steps, started = self.global_step, time.monotonic()
        fit(self, *args, **kwargs)
        clocks["seconds"].append(time.monotonic() - started)
        clocks["steps"].append(self.global_step - steps)

    def timed_run(cfg: Any) -> float | None:
        started = time.monotonic()
        try:
            return run(cfg)
        finally:
            clocks["job_seconds"].append(time.monotonic() - started)

    Trainer.fit, command.run = timed_fit, timed_run  # type: ignore[method-assign]
    sys.argv = [command.PROG, *argv]
    try:
        command.main()
    finally:
        with open(out, "w") as handle:
            json.dump(clocks, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
