"""`ddp-train` under SLURM, preempted from outside: the launching process gets SIGTERM, the job
exits 75 after one checkpoint in its run directory (named after the job id), requeues itself with
`scontrol requeue` (a fake on PATH records the call), and the requeued command resumes there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from strategies.preemption import PREEMPTED_EXIT_CODE

REPO = Path(__file__).resolve().parents[2]
JOB_ID = "4242"


def _start(cwd: Path, ready: Path, scontrol_log: Path) -> subprocess.Popen[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM_", "HYDRA_"))}
    env.update(SLURM_JOB_ID=JOB_ID, PATH=f"{cwd / 'bin'}:{env['PATH']}", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               SCONTROL_LOG=str(scontrol_log))
    args = ["experiment=synthetic_regression", "trainer.max_epochs=30", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "logger=none", "callbacks.lr_monitor=null",
            "callbacks.telemetry=null", "+callbacks.ready._target_=tests.helpers.preemption.MarkReady",
            f"+callbacks.ready.path={ready}"]
    return subprocess.Popen([sys.executable, "-m", "trainer", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.timeout(300)
@pytest.mark.conformance
def test_slurm_job_is_checkpointed_requeued_and_resumes(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "scontrol"
    fake.write_text('#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n')
    fake.chmod(0o755)
    scontrol_log, ready = tmp_path / "scontrol.log", tmp_path / "ready"

    first = _start(tmp_path, ready, scontrol_log)
    _wait_for(ready, first)
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=120)
    assert first.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "ddp-train: preempted by SIGTERM after step" in err, err[-3000:]
    assert scontrol_log.read_text().split() == ["requeue", JOB_ID]
    (run_dir,) = (tmp_path / "outputs").glob(f"slurm-{JOB_ID}-*")  # the job id and a digest of the command
    checkpoint = torch.load(run_dir / "preempted.ckpt", weights_only=True)
    stopped_at = checkpoint["global_step"]
    assert 3 < stopped_at < 30 * 26, stopped_at

    ready.unlink()
    second = _start(tmp_path, ready, scontrol_log)
    out, err = second.communicate(timeout=240)
    assert second.returncode == 0, err[-3000:]
    assert f"Found the preemption checkpoint {run_dir / 'preempted.ckpt'}" in out + err
    assert list((tmp_path / "outputs").glob(f"slurm-{JOB_ID}-*")) == [run_dir], "the requeued command's directory"
    assert "finished in" in out and "epoch 30" in out, out
    assert not ready.exists(), "the resumed run started after the step the callback marks"
    assert not (run_dir / "preempted.ckpt").exists()
    assert scontrol_log.read_text().split() == ["requeue", JOB_ID], "requeued once"
