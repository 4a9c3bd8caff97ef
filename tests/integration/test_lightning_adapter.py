"""Both directions between Lightning and us, on 2 real gloo processes.

1. `LightningDDPStrategy` inside `pytorch_lightning.Trainer` ends with the same weights as
   Lightning's own `strategy="ddp"` (torch DDP) on Lightning's demo modules.
   With BatchNorm, validation sees the same buffers on every rank as under torch DDP.
2. The unified `lightning.pytorch.Trainer` trains with the unified variant.
3. Our `Trainer` fits unchanged Lightning modules of both packages.

The multi-case runs go through torchrun (`tests/helpers/lightning_parity.py`): one job per
mode pays the Lightning imports once, and Lightning's default launcher would re-run pytest.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.rank_checks import RankAgreement
from trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 150
# Keep in step with PARITY_CASES in tests/helpers/lightning_parity.py (not imported here, so that
# collecting the suite does not import pytorch_lightning).
PARITY_CASES = ("demo", "demo-accumulate", "transformer", "transformer-accumulate", "manual", "manual-accumulate",
                "features-bf16")
BUFFER_CASES = ("batchnorm", "batchnorm-accumulate")  # BUFFER_CASES there


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run in a new session, so a timeout kills the launcher *and* every worker it started."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{command} did not finish in {JOB_TIMEOUT_S} s:\n{output[-6000:]}")
    return subprocess.CompletedProcess(command, process.returncode, output)


def _torchrun(mode: str, out_dir: Path) -> dict[str, Any]:
    result = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                   str(ROOT / "tests" / "helpers" / "lightning_parity.py"), mode, str(out_dir)], cwd=out_dir)
    if result.returncode != 0:
        pytest.fail(f"torchrun {mode} failed (exit {result.returncode}):\n{result.stdout[-6000:]}")
    return torch.load(out_dir / f"{mode}.pt", weights_only=True)


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _torchrun("parity", tmp_path_factory.mktemp("parity"))


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _torchrun("ours", tmp_path_factory.mktemp("ours"))


@pytest.fixture(scope="module")
def buffers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _torchrun("buffers", tmp_path_factory.mktemp("buffers"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[key] - b[key]).abs().max()) for key in a)


# ---------------------------------------------------------------- 1. pytorch_lightning.Trainer
@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
@pytest.mark.parametrize("case", PARITY_CASES)
@pytest.mark.conformance
def test_same_weights_as_lightning_ddp(parity: dict[str, Any], case: str) -> None:
    ddp, ours_run = parity[case]["ddp"], parity[case]["ours"]
    assert ddp["model_type"] == "DistributedDataParallel"
    assert ours_run["model_type"] == "ReducedModule"  # no torch DDP inside our strategy
    assert ours_run["rank_diff"] == 0.0 and ddp["rank_diff"] == 0.0
    assert ours_run["global_step"] == ddp["global_step"] > 1
    assert _max_diff(ours_run["weights"], ddp["weights"]) < 1e-5
    # One reduction per optimizer step: with accumulate_grad_batches=2 the first micro-batch of
    # each window ran inside block_backward_sync (no communication).
    assert ours_run["reducer"]["synced_steps"] == ours_run["global_step"]
    assert ours_run["metrics"] == pytest.approx(ddp["metrics"], abs=1e-6)


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_bf16_checkpoint_validation_and_test_loops(parity: dict[str, Any]) -> None:
    ddp, ours_run = parity["features-bf16"]["ddp"], parity["features-bf16"]["ours"]
    assert ours_run["test_loss"] == pytest.approx(ddp["test_loss"], abs=1e-6)
    assert "val_loss" in ours_run["metrics"]  # logged with sync_dist=True
    for path in (ours_run["best"], ours_run["last"]):
        checkpoint = torch.load(path, weights_only=False, map_location="cpu")  # Lightning's own file format
        assert _max_diff(checkpoint["state_dict"], ours_run["weights"]) == 0.0  # no "module." prefixes


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_compressed_comm_hook_by_name(parity: dict[str, Any]) -> None:
    run = parity["demo-bf16-hook"]["ours"]
    assert run["reducer"]["comm_hook"] == "bf16_compress"
    assert run["rank_diff"] == 0.0
    assert _max_diff(run["weights"], parity["demo-bf16-hook"]["ddp"]["weights"]) < 0.1  # bf16 rounding


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
@pytest.mark.parametrize("case", BUFFER_CASES)
@pytest.mark.conformance
def test_batchnorm_buffers_sync_like_lightning_ddp(buffers: dict[str, Any], case: str) -> None:
    # Torch DDP copies rank 0's buffers at the start of a forward only when the previous forward
    # was a synchronised training one, so the first validation forward after training syncs the
    # running statistics and the first training forward after validation does not. Validation
    # losses (per rank and synced) and every rank's final buffers show whether ours does the same.
    ddp, ours_run = buffers[case]["ddp"], buffers[case]["ours"]
    assert ours_run["global_step"] == ddp["global_step"] > 1
    assert len(ddp["val_loss"]) == 5  # sanity check + two validations in each of two epochs
    assert ours_run["val_loss"] == pytest.approx(ddp["val_loss"], rel=1e-6, abs=1e-6)
    for rank, (ours_losses, ddp_losses) in enumerate(zip(ours_run["rank_val_losses"], ddp["rank_val_losses"])):
        assert ours_losses == pytest.approx(ddp_losses, rel=1e-6, abs=1e-6), f"rank {rank}"
    for rank, (ours_state, ddp_state) in enumerate(zip(ours_run["rank_weights"], ddp["rank_weights"])):
        assert _max_diff(ours_state, ddp_state) < 1e-5, f"rank {rank}"


# ---------------------------------------------------------------- 2. lightning.pytorch.Trainer
@pytest.mark.timeout(120)
@pytest.mark.conformance
def test_unified_lightning_trainer_trains_with_spawn(tmp_path: Path) -> None:
    import lightning.pytorch as lp

    from strategies.lightning.unified import LightningDDPStrategy
    from tests.helpers.lightning_unified import RankDiffMetric, UnifiedRegressor, regression_data

    lp.seed_everything(0, verbose=False)
    model = UnifiedRegressor()
    before = model.layer.weight.detach().clone()
    initial_loss = model.mse(regression_data(32))
    trainer = lp.Trainer(accelerator="cpu", devices=2, strategy="bucket_ddp_spawn", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, callbacks=[RankDiffMetric()])
    assert isinstance(trainer.strategy, LightningDDPStrategy)
    trainer.fit(model)
    metrics = trainer.callback_metrics  # returned from rank 0 by Lightning's spawn launcher
    assert float(metrics["rank_diff"]) == 0.0 and float(metrics["strategy_model"]) == 1.0
    assert float(metrics["val_loss"]) < initial_loss / 2
    assert model.mse(regression_data(32)) == pytest.approx(float(metrics["val_loss"]), rel=1e-4)  # weights came back
    assert not torch.equal(model.layer.weight, before)


# ---------------------------------------------------------------- 3. our Trainer, Lightning modules
@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
@pytest.mark.parametrize("name", ["boring", "manual", "transformer"])
@pytest.mark.conformance
def test_our_trainer_fits_lightning_demo_modules(ours: dict[str, Any], name: str) -> None:
    run = ours[name]
    assert run["world_size"] == 2 and run["rank_diff"] == 0.0
    assert run["change"] > 0 and run["global_step"] == 4
    if name == "transformer":
        assert "train_loss" in run["logged"]


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_our_trainer_matches_lightning_ddp(ours: dict[str, Any], parity: dict[str, Any]) -> None:
    assert ours["demo"]["rank_diff"] == 0.0
    assert _max_diff(ours["demo"]["weights"], parity["demo"]["ddp"]["weights"]) < 1e-5


@pytest.mark.timeout(120)
def test_our_trainer_launches_unified_lightning_module(tmp_path: Path) -> None:
    from tests.helpers.lightning_unified import UnifiedRegressor

    torch.manual_seed(0)
    model = UnifiedRegressor()
    before = model.layer.weight.detach().clone()
    agreement = RankAgreement()
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, callbacks=[agreement])
    trainer.fit(model)  # pickled into our launcher's workers and back
    assert agreement.world_size == 2 and agreement.max_rank_diff == 0.0
    assert {"train_loss", "val_loss"} <= set(trainer.callback_metrics)
    assert not torch.equal(model.layer.weight, before)


# ---------------------------------------------------------------- launcher, registry, options
@pytest.mark.timeout(JOB_TIMEOUT_S + 30)  # past _run's own limit, so a stall prints its output
@pytest.mark.conformance
def test_example_project_runs_with_lightnings_subprocess_launcher(tmp_path: Path) -> None:
    result = _run([sys.executable, str(ROOT / "examples" / "lightning_project.py")], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:]
    accuracy = float(result.stdout.rsplit("val_acc=", 1)[1].split()[0])
    assert accuracy > 0.6


@pytest.mark.timeout(60)
def test_registered_names_and_pickling() -> None:
    import pytorch_lightning as pl

    from strategies.lightning import LightningDDPStrategy

    for name, start_method in (("bucket_ddp", "popen"), ("bucket_ddp_spawn", "spawn")):
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=name, logger=False)
        assert type(trainer.strategy) is LightningDDPStrategy
        assert trainer.strategy._start_method == start_method
    strategy = pickle.loads(pickle.dumps(LightningDDPStrategy(bucket_cap_mb=4, comm_hook="fp16")))
    assert type(strategy) is LightningDDPStrategy and strategy.reducer_options.comm_hook == "fp16"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kwargs", "error", "names"), [
    ({"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb"),
    ({"first_bucket_cap_mb": "1"}, TypeError, "first_bucket_cap_mb"),
    ({"find_unused_parameters": "yes"}, TypeError, "find_unused_parameters"),
    ({"comm_hook": "int8"}, ValueError, "comm_hook"),
    ({"start_method": "thread"}, ValueError, "start_method"),
    ({"static_graph": True}, TypeError, "static_graph"),  # torch-DDP-only option: refused, not ignored
])
def test_bad_options_fail_at_construction(kwargs: dict[str, Any], error: type[Exception], names: str) -> None:
    from strategies.lightning import LightningDDPStrategy

    with pytest.raises(error, match=names):
        LightningDDPStrategy(**kwargs)
