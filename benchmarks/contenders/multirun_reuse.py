"""`python -m benchmarks.contenders.multirun_reuse OUT_JSON OVERRIDE...`: the jobs of
`ddp-train -m seed=1,2,3,4 OVERRIDE...` as 4 fits on ONE Trainer (built once from the same config by the
CLI's own `build`), each with a fresh model and datamodule and its own seed; writes each fit's seconds
(what the CLI's "finished in" line times: `trainer.fit` alone)."""

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
    seconds = []
    for seed in SEEDS:
        seed_everything(seed)
        datamodule, model, fresh = build(cfg)
        trainer = trainer or fresh
        started = time.monotonic()
        trainer.fit(model, datamodule=datamodule)
        seconds.append(time.monotonic() - started)
    with open(out, "w") as handle:
        json.dump({"seconds": seconds}, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
