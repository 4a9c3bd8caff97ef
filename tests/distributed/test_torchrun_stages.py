"""Under torchrun the process outlives a stage: fit -> test -> fit must reuse the process group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
def test_several_stages_in_one_torchrun_job() -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "tests.helpers.torchrun_two_stages"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    done = [line for line in result.stdout.splitlines() if " done test_loss=" in line]
    assert len(done) == 2 and done[0].split("=")[-1] == done[1].split("=")[-1]
