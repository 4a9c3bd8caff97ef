"""A preemption notice (SIGTERM, SIGUSR1) to one rank, every rank or the launching process: every
rank stops after the same step, one checkpoint is written, the launch exits with code 75, and the
next fit in the same directory resumes from it and ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import DDPStrategy
from strategies.preemption import PREEMPTED_EXIT_CODE, Preempted
from tests.helpers.models import DropoutRegressor, RegressionData
from tests.helpers.preemption import ManualEveryOtherBatch, NoticeAtStep, SeesSigterm, StuckAfterNotice
from trainer import Trainer, seed_everything

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]
EPOCHS = 3  # 64 samples, 2 ranks x 8 per batch: 4 steps per epoch, 12 in all


def _fit(model: Any, root: Path, **strategy_kwargs: Any) -> Trainer:
    trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(**strategy_kwargs), max_epochs=EPOCHS,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=root)
    trainer.fit(model, datamodule=RegressionData(batch_size=8, shuffle=True))
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    seed_everything(11)
    model = DropoutRegressor()
    _fit(model, tmp_path_factory.mktemp("uninterrupted"))
    return {key: value.clone() for key, value in model.state_dict().items()}


def _preempt_then_resume(root: Path, step: int, to: str, signal_name: str = "SIGTERM") -> tuple[Preempted, Any]:
    seed_everything(11)
    with pytest.raises(Preempted) as stopped:
        _fit(NoticeAtStep(step, to, signal_name, launcher_pid=os.getpid()), root)
    checkpoint = torch.load(root / "preempted.ckpt", weights_only=True)
    seed_everything(11)
    resumed = NoticeAtStep(step, to, signal_name, launcher_pid=os.getpid())
    trainer = _fit(resumed, root)
    assert trainer.global_step == 4 * EPOCHS
    assert not (root / "preempted.ckpt").exists(), "a completed fit removes the checkpoint it resumed from"
    return stopped.value, (checkpoint, resumed)


@pytest.mark.parametrize(("step", "to", "signal_name"), [
    pytest.param(5, "rank1", "SIGTERM", marks=pytest.mark.conformance),     # mid-epoch, one rank
    pytest.param(5, "all", "SIGUSR1", marks=pytest.mark.conformance),       # every rank, SLURM's signal
    pytest.param(6, "launcher", "SIGTERM", marks=pytest.mark.conformance),  # the launching process only (Kubernetes signals the main process)
    (2, "rank0", "SIGTERM"),     # the agreed step is an epoch's last batch: stops between epochs
])
def test_notice_checkpoints_and_resumes_bit_exactly(tmp_path: Path, uninterrupted: dict[str, torch.Tensor],
                                                    step: int, to: str, signal_name: str) -> None:
    notice, (checkpoint, resumed) = _preempt_then_resume(tmp_path, step, to, signal_name)
    assert notice.code == PREEMPTED_EXIT_CODE and notice.signal_name == signal_name
    ours = checkpoint["loops"]["ddp_trainer"]
    assert ours["preemption"]["signal"] == signal_name
    stopped_after = checkpoint["global_step"]
    assert step + 1 <= stopped_after <= step + 2, "at most the step in flight and one more run before the stop"
    if step == 2:
        assert ours["batch_in_epoch"] == 0 and checkpoint["epoch"] == 1, "stopped between epochs"
    for key, value in uninterrupted.items():
        assert torch.equal(value, resumed.state_dict()[key]), key


@pytest.mark.conformance
def test_our_restart_resumes_from_the_preemption_checkpoint(tmp_path: Path,
                                                            uninterrupted: dict[str, torch.Tensor]) -> None:
    """A notice to one worker alone (not to the launching process): with max_restarts the group restarts
    and resumes from the preemption checkpoint within the same launch; a notice to the launching
    process means the job is going away, so it is not restarted."""
    seed_everything(11)
    model = NoticeAtStep(5, "rank1")
    with pytest.warns(RuntimeWarning, match="restarting the workers .* after a worker was preempted by SIGTERM"):
        trainer = _fit(model, tmp_path / "worker", max_restarts=1)
    assert trainer.global_step == 4 * EPOCHS and not (tmp_path / "worker" / "preempted.ckpt").exists()
    for key, value in uninterrupted.items():
        assert torch.equal(value, model.state_dict()[key]), key
    seed_everything(11)
    with pytest.raises(Preempted):
        _fit(NoticeAtStep(5, "launcher", launcher_pid=os.getpid()), tmp_path / "launcher", max_restarts=1)


def _torchrun(root: Path, notice_step: int) -> dict[str, Any]:
    out = root / "weights.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1", "-m", "tests.helpers.torchrun_preempt_resume", str(root), str(out),
               str(notice_step)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"log": result.stdout + result.stderr, **torch.load(out, weights_only=True)}


@pytest.mark.conformance
def test_torchrun_restart_resumes_from_the_preemption_checkpoint(tmp_path: Path) -> None:
    """torchrun's agent sees every rank exit 75 and restarts the group, which resumes by itself; the
    oracle is an uninterrupted torchrun run (its ranks build the model before their dropout draws)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain, restarted = _torchrun(tmp_path / "a", notice_step=-1), _torchrun(tmp_path / "b", notice_step=5)
    assert "Found the preemption checkpoint" in restarted["log"]
    assert "Resuming" not in plain["log"]
    assert restarted["global_step"] == plain["global_step"] == 4 * EPOCHS
    for key, value in plain["state_dict"].items():
        assert torch.equal(value, restarted["state_dict"][key]), key


STUCK = """
import sys
from tests.distributed.test_preemption import _fit
from tests.helpers.preemption import StuckAfterNotice
from trainer import seed_everything
import os

if __name__ == "__main__":
    seed_everything(11)
    _fit(StuckAfterNotice(5, "launcher", launcher_pid=os.getpid()), sys.argv[1], preemption={"grace_period_s": 3})
"""


@pytest.mark.conformance
def test_no_checkpoint_within_the_grace_period_still_exits_75_in_time(tmp_path: Path) -> None:
    """The launching process is rank 0, so the grace deadline ends the script itself (exit 75), as it
    ends a torchrun rank: the scheduler's SIGKILL would come next. Run as a script, since it exits."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert time.monotonic() - started < 3 + 30, "ended by the grace deadline, not the hang guard or a timeout"
    assert done.returncode == PREEMPTED_EXIT_CODE, done.stderr[-3000:]
    assert "no checkpoint within the grace period" in done.stderr and not (tmp_path / "preempted.ckpt").exists()


def test_one_process_stops_at_the_next_boundary_and_sets_lightnings_flag(tmp_path: Path) -> None:
    """devices=1 (no store): the notice's own boundary is the stop; `trainer.received_sigterm` turns True."""
    seed_everything(11)
    seen = SeesSigterm()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[seen])
    with pytest.raises(Preempted) as stopped:
        trainer.fit(NoticeAtStep(5, "rank0"), datamodule=RegressionData(batch_size=8, shuffle=True))
    assert stopped.value.step == 6 and torch.load(tmp_path / "preempted.ckpt", weights_only=True)["global_step"] == 6
    assert seen.seen == [False] * 5 + [True]
    assert trainer.received_sigterm, "stays True after the fit, as Lightning's (tests/integration/test_preemption_vs_lightning.py)"


@pytest.mark.conformance
def test_steps_without_a_collective_still_stop_every_rank_together(tmp_path: Path) -> None:
    """Manual optimization that skips backward on odd batches: between two boundaries nothing makes the
    ranks meet, so the watch adds a barrier there; the ranks stop together and resume bit-exactly."""
    def fit(notice_rank: int, root: Path) -> tuple[Trainer, ManualEveryOtherBatch]:
        seed_everything(3)
        model = ManualEveryOtherBatch(notice_rank)
        trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(stall_timeout=15), max_epochs=2,
                          logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=root)
        trainer.fit(model, datamodule=RegressionData(batch_size=4))
        return trainer, model

    _, plain = fit(-1, tmp_path / "plain")
    with pytest.raises(Preempted) as stopped:
        fit(1, tmp_path / "run")
    assert stopped.value.checkpoint_path == str(tmp_path / "run" / "preempted.ckpt")
    trainer, resumed = fit(1, tmp_path / "run")  # resumes past the notice's batch
    assert trainer.current_epoch == 2
    for key, value in plain.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
