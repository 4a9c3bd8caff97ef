"""The CUDA path for real: nccl at world size 1, bf16-mixed, the CLI's digits job on a GPU and
its checkpoint resumed on the CPU. Skipped where no GPU is visible (CI has none); run on a
machine with one (benchmarks/README.md, "On a GPU", says when that last happened)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.cuda_parity import STEPS
from tests.integration.test_fit_e2e import ddp_train, run_dirs, scalars

ROOT = Path(__file__).parents[2]
pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.timeout(300)]


@pytest.mark.parametrize(("precision", "tolerance"), [("32-true", 1e-5), ("bf16-mixed", 1e-2)])
def test_nccl_at_world_size_1_matches_torch_ddp(precision: str, tolerance: float, tmp_path: Path) -> None:
    out = tmp_path / "parity.json"
    done = subprocess.run([sys.executable, "-m", "tests.helpers.cuda_parity", precision, str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert (result["backend"], result["world_size"], result["param_device"]) == ("nccl", 1, "cuda:0")
    assert result["autocast"] == [precision == "bf16-mixed"] * STEPS  # every step, in the precision asked for
    assert len(result["losses"]) == len(result["reference_losses"]) == STEPS
    assert result["max_param_diff"] <= tolerance and result["max_loss_diff"] <= tolerance, result
    assert result["losses"][-1] < 0.5 * result["losses"][0], result["losses"]  # it learns, not just agrees
    assert result["val_loss"] > 0


def test_cli_digits_on_cuda_in_bf16_resumes_on_the_cpu(tmp_path: Path) -> None:
    ddp_train(["trainer=fast", "trainer.accelerator=cuda", "trainer.devices=1", "trainer.precision=bf16-mixed"],
              tmp_path / "gpu")
    (gpu_run,) = run_dirs(tmp_path / "gpu")
    metrics = scalars(gpu_run)
    assert len(metrics["val_acc"]) == 2 and 0.0 < metrics["val_acc"][-1][1] <= 1.0
    last = gpu_run / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert saved["epoch"] == 1 and saved["state_dict"]
    # A GPU checkpoint resumes on a machine without one (checkpoints load onto the CPU first).
    ddp_train(["trainer=fast", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.max_epochs=3",
               f"ckpt_path={last}"], tmp_path / "cpu")
    (cpu_run,) = run_dirs(tmp_path / "cpu")
    resumed = scalars(cpu_run)["val_acc"]  # only the one epoch left, after the GPU run's steps: a resume
    assert len(resumed) == 1 and resumed[0][0] > metrics["val_acc"][-1][0], (resumed, metrics["val_acc"])


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_steps_that_do_not_log_never_wait_for_the_gpu(strategy: str, tmp_path: Path) -> None:
    # torch raises on any host synchronisation while the sync debug mode is "error": it is on for
    # every batch except those that write to the loggers (and the epoch's last, which reads on purpose).
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import LightningModule, Trainer
    from trainer.callbacks import Callback

    every, batches = 10, 40

    class Logs(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(64, 1)

        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            x, y = batch  # type: ignore[misc]
            loss = nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class StrictSync(Callback):
        def on_train_batch_start(self, trainer: object, pl_module: object, batch: object, batch_idx: int) -> None:
            quiet = 2 <= batch_idx < batches - 1 and (batch_idx + 1) % every != 0
            torch.cuda.set_sync_debug_mode("error" if quiet else "default")

        def on_train_end(self, trainer: object, pl_module: object) -> None:
            torch.cuda.set_sync_debug_mode("default")

    data = TensorDataset(torch.randn(batches * 8, 64), torch.randn(batches * 8, 1))
    trainer = Trainer(accelerator="cuda", devices=1, strategy=strategy, max_epochs=1, log_every_n_steps=every,
                      precision="bf16-mixed", default_root_dir=str(tmp_path), callbacks=[StrictSync()])
    try:
        trainer.fit(Logs(), DataLoader(data, batch_size=8, pin_memory=True))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer.global_step == batches and float(trainer.callback_metrics["train_loss"]) > 0
