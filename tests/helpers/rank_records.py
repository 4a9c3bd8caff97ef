"""A callback a `ddp-train` job can be given on the command line (`+callbacks.ranks._target_=...`): each
rank writes, into the job's own run directory, which process it is and how many process groups that
process has made so far."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from strategies.process_group import groups_made
from trainer.callbacks import Callback


class RankRecorder(Callback):
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        record = f"{os.getpid()} {groups_made()}"
        Path(trainer.default_root_dir, f"rank-{trainer.global_rank}.txt").write_text(record)


def read_records(run_dir: Path, world_size: int) -> list[tuple[int, int]]:
    """(pid, groups made) of each rank of the job that ran in `run_dir`."""
    rows = [Path(run_dir, f"rank-{rank}.txt").read_text().split() for rank in range(world_size)]
    return [(int(pid), int(groups)) for pid, groups in rows]
