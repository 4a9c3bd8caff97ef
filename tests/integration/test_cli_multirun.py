"""`ddp-train -m`: Hydra's basic launcher runs the jobs one after the other in the calling process, each
with its own Trainer, and every job after the first reaches the same ranks and their process group (#36):
no process starts and no group is made again while world size, backend and timeout stay the same; a job
whose group options differ gets a new group on the same ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.processes import alive
from tests.helpers.rank_records import read_records

REPO = Path(__file__).resolve().parents[2]
SHORT_JOB = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
             "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false",
             "trainer.enable_model_summary=false", "trainer.enable_checkpointing=false", "logger=none",
             "callbacks=none", "+callbacks.ranks._target_=tests.helpers.rank_records.RankRecorder"]


def multirun(sweep: str, tmp_path: Path) -> list[list[tuple[int, int]]]:
    """Run `ddp-train -m SWEEP` with 2 ranks; each job's (pid, groups made) per rank, in job order."""
    environment = {name: value for name, value in os.environ.items() if name != "HYDRA_FULL_ERROR"}
    environment.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))  # one thread a rank: ranks start by fork
    done = subprocess.run([sys.executable, "-m", "trainer", "-m", sweep, f"hydra.sweep.dir={tmp_path}", *SHORT_JOB],
                          cwd=tmp_path, env=environment, text=True, capture_output=True, timeout=200)
    assert done.returncode == 0, done.stderr[-5000:]
    jobs = sorted((path for path in tmp_path.iterdir() if path.name.isdigit()), key=lambda path: int(path.name))
    return [read_records(job, 2) for job in jobs]


@pytest.mark.timeout(240)
def test_later_jobs_reuse_the_ranks_and_their_group(tmp_path: Path) -> None:
    jobs = multirun("seed=1,2,3", tmp_path)
    assert len(jobs) == 3
    caller, rank_one = jobs[0][0][0], jobs[0][1][0]
    assert caller != rank_one
    assert all(job[0][0] == caller and job[1][0] == rank_one for job in jobs)  # the same two processes
    groups = [(job[0][1], job[1][1]) for job in jobs]
    assert groups[0][0] >= 1 and groups[0][1] >= 1
    assert groups[1:] == [groups[0]] * 2  # no rank made a group after the first job's
    assert not alive(rank_one)  # nothing outlives the command


@pytest.mark.timeout(240)
def test_a_job_with_another_timeout_gets_a_new_group_on_the_same_ranks(tmp_path: Path) -> None:
    jobs = multirun("strategy.timeout.seconds=600,600,300", tmp_path)
    (caller, first), (rank_one, first_one) = jobs[0]
    assert [pid for job in jobs for pid, _ in job] == [caller, rank_one] * 3
    assert [groups for job in jobs for _, groups in job] == [first, first_one, first, first_one,
                                                             first + 1, first_one + 1]
