"""`python -m benchmarks.contenders.multirun_reuse OUT_JSON OVERRIDE...`: the jobs of
`ddp-train -m seed=1,2,3,4 OVERRIDE...` as 4 fits on ONE Trainer (built once from the same config by the
CLI's own `build`), each with a fresh model and datamodule and its own seed; writes each job's clocks as
benchmarks/contenders/multirun_jobs.py does: `seconds` (`trainer.fit` alone, what the CLI's "finished in"
line times), `job_seconds` (seed, build, fit) and `steps` (optimizer steps of each fit).

Each fit trains the epochs a job trains: a Trainer's fit stops at its `max_epochs`, which the first fit
reached, so before each later fit the limit is raised by the config's `trainer.max_epochs` (Lightning's
`trainer.fit_loop.max_epochs`). Without that, fits 2-4 train no step at all.
"""

from __future__ import annotations

import json
import sys
import time

from hydra import compose, initialize_config_dir

from trainer import seed_everything
from trainer.cli.command import build
from trainer.cli.schemas import config_dir

SEEDS = (1, 2, 3, 4)


def main(out: str, overrides: list[str]) -> None:
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    trainer = None
    clocks: dict[str, list[float]] = {"seconds": [], "job_seconds": [], "steps": []}
    for seed in SEEDS:
        job_started = time.monotonic()
        seed_everything(seed)
        datamodule, model, fresh = build(cfg)
        trainer = trainer or fresh
        trainer.max_epochs = trainer.current_epoch + cfg.trainer.max_epochs
        steps, started = trainer.global_step, time.monotonic()
        trainer.fit(model, datamodule=datamodule)
        clocks["seconds"].append(time.monotonic() - started)
        clocks["job_seconds"].append(time.monotonic() - job_started)
        clocks["steps"].append(trainer.global_step - steps)
    with open(out, "w") as handle:
        json.dump(clocks, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
