"""Rank 0 SIGKILLed in the middle of a background checkpoint write (#40, the fault harness's savekill with
async_checkpoint=True): no corrupt file, the newest complete checkpoint is there, and resuming from it ends
bit-identical to a fit that was never interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO
from tests.helpers.async_kill_job import MAX_STEPS, fit

pytestmark = pytest.mark.timeout(300)


def _alive_in_session(session: int) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                alive.append(int(entry.name))
    return alive


@pytest.mark.conformance
def test_a_kill_during_a_background_write_leaves_complete_files_and_resumes_exactly(tmp_path: Path) -> None:
    save_index, after_bytes = 3, 700  # step 4's top-k file (each save event writes it, then last.ckpt)
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    job = subprocess.Popen([sys.executable, "-m", "tests.helpers.async_kill_job", str(killed_dir), str(save_index),
                            str(after_bytes)], cwd=Path(__file__).parents[2], start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    code = job.wait(timeout=240)
    deadline = time.monotonic() + 20  # rank 1 notices that rank 0 is gone and exits
    while _alive_in_session(job.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftover = _alive_in_session(job.pid)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert code == -signal.SIGKILL and not (killed_dir / "not_killed.pt").exists()
    assert leftover == [], "processes outlived the killed rank 0"
    files = sorted(killed_dir.glob("*.ckpt"))
    steps = []
    for file in files:  # every file left loads: none is partial
        try:
            steps.append(TorchCheckpointIO().load(file)["global_step"])
        except CheckpointError as error:
            pytest.fail(f"a corrupt checkpoint was left: {error}")
    # step 2's files are whole and still there: step=2.ckpt is rotated out only once step=4.ckpt commits
    assert sorted(file.name for file in files) == ["last.ckpt", "step=2.ckpt"] and steps == [2, 2]
    resumed = fit(killed_dir, TorchCheckpointIO(), ckpt_path="last")  # finds the newest complete checkpoint
    straight = fit(tmp_path / "straight", TorchCheckpointIO())
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    assert torch.load(killed_dir / "last.ckpt", weights_only=True)["global_step"] == MAX_STEPS
