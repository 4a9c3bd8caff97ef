"""`LightningDDPStrategy` inside `pytorch_lightning.Trainer`: SIGTERM to one rank stops every rank
after the same batch through Lightning's own `SIGTERMException`, Lightning's SLURM checkpoint
(`hpc_ckpt_1.ckpt`) is written, and `ckpt_path="hpc"` resumes to the end. Run under torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("pytorch_lightning")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("notice_step", [5, 4])
@pytest.mark.conformance
def test_lightning_trainer_stops_together_checkpoints_and_resumes(tmp_path: Path, notice_step: int) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
               "tests.helpers.lightning_preemption", str(tmp_path), str(notice_step)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert result.returncode == 0, result.stderr[-4000:]
    outcome = torch.load(tmp_path / "result.pt", weights_only=False)
    assert outcome["raised"] == "SIGTERMException"  # Lightning's own exit, on every rank (the save is collective)
    assert outcome["code"] == 75  # not Lightning's 0: a preempted run must not count as a success
    # the notice came during step `notice_step`; the ranks agree on a later batch; 4 batches per epoch
    assert notice_step + 2 <= outcome["checkpoint_step"] <= notice_step + 3
    assert outcome["plain_step"] == outcome["resumed_step"] == 12
    if outcome["checkpoint_step"] % 4 == 0:  # an epoch's end: Lightning's own resume is exact there
        for key, value in outcome["plain"].items():
            assert torch.equal(value, outcome["resumed"][key]), key
    else:  # mid-epoch: Lightning's resume redraws the epoch's batches (it warns so itself); it still completes
        assert "dataloader is not resumable" in result.stderr
