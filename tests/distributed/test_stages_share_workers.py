"""Fit, validate, test and predict run in this process (global rank 0, as in Lightning's `ddp`) and
in rank 1, for modules, callbacks and data defined inside a function or in a script's `__main__`:
rank 1 forked from this process for the first stage where forking is safe (one CPU thread per
rank: OMP_NUM_THREADS=1 here) and kept for the next, else a pool worker from a forkserver; a failed stage leaves the Trainer usable; workers
waiting between stages end with their launcher."""

from __future__ import annotations

import os
import subprocess
import sys
import socket
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.launcher import WorkerFailedError
from trainer import LightningModule, Trainer
from tests.helpers.processes import alive, wait_until_ended
from trainer.callbacks import Callback, ModelCheckpoint

REPO = Path(__file__).parents[2]
PROMPT_S = 10
# How ranks 1.. live, chosen by each rank's CPU share: one thread lets them be forked per stage,
# more keeps them in the process's worker pool (a fork after OpenMP ran would hang).
THREADS = {"fork": "1", "pool": "2"}


@pytest.fixture(params=["fork", "pool"])
def ranks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OMP_NUM_THREADS", THREADS[request.param])
    return str(request.param)




def _build(pid_dir: Path, fail_on_rank: int | None = None) -> tuple[LightningModule, Callback]:
    """A module and a callback whose classes exist only inside this call (no worker can import them)."""

    class Regressor(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if fail_on_rank == self.global_rank:
                raise ValueError(f"planted failure on rank {self.global_rank}")
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.layer(x), y, reduction="sum") / 24, reduce_fx="sum",
                     sync_dist=True)

        def test_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("test_loss", nn.functional.mse_loss(self.layer(x), y, reduction="sum") / 24, reduce_fx="sum",
                     sync_dist=True)

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[0])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class RecordPids(Callback):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            Path(pid_dir, f"{stage}-{trainer.global_rank}.pid").write_text(str(os.getpid()))

    return Regressor(), RecordPids()


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(24, 4, generator=generator), torch.randn(24, 1, generator=generator))


def _loader() -> DataLoader:
    return DataLoader(_data(), batch_size=4)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _pids(pid_dir: Path, stage: str) -> list[int]:
    return [int(Path(pid_dir, f"{stage}-{rank}.pid").read_text()) for rank in range(2)]


def _trainer(tmp_path: Path, callback: Callback, **kwargs: Any) -> Trainer:
    return Trainer(accelerator="cpu", devices=2, max_epochs=3, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                   callbacks=[callback, ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), monitor="val_loss",
                                                        save_top_k=1)], **kwargs)


@pytest.mark.timeout(180)
def test_every_stage_runs_with_a_model_defined_in_a_function(tmp_path: Path, ranks: str) -> None:
    model, recorder = _build(tmp_path)
    trainer = _trainer(tmp_path, recorder)
    trainer.fit(model, _loader(), _loader())
    validated = trainer.validate(model, _loader())
    tested = trainer.test(model, _loader())
    predictions = trainer.predict(model, _loader())
    fit_pids = _pids(tmp_path, "fit")
    assert fit_pids[0] == os.getpid() and fit_pids[1] != os.getpid()  # rank 0 is this process
    for stage in ("validate", "test", "predict"):
        assert _pids(tmp_path, stage) == fit_pids  # no stage started a process
    # Forked from this process for the fit (then kept), or a pool's worker forked from its forkserver.
    assert (_parent(fit_pids[1]) == os.getpid()) == (ranks == "fork")
    # This process's model is the one rank 0 trained; one process on the whole set agrees.
    x, y = _data().tensors
    with torch.no_grad():
        expected = float(nn.functional.mse_loss(model.layer(x), y))
        everyone = model.layer(x)
    mine = torch.cat(predictions)  # rank 0's shard, as with Lightning's ddp
    assert len(mine) == 12 and torch.cdist(mine, everyone).min(dim=1).values.max() < 1e-5
    assert validated[0]["val_loss"] == pytest.approx(expected, rel=1e-5)
    assert tested[0]["test_loss"] == pytest.approx(expected, rel=1e-5)
    trainer.strategy.stop_workers()
    assert not alive(fit_pids[1])


@pytest.mark.timeout(180)
def test_test_after_fit_uses_the_best_checkpoint(tmp_path: Path, ranks: str) -> None:
    model, recorder = _build(tmp_path)
    trainer = _trainer(tmp_path, recorder)
    trainer.fit(model, _loader(), _loader())
    best = trainer.checkpoint_callback.best_model_path
    tested = trainer.test(ckpt_path="best", dataloaders=_loader())
    assert trainer.ckpt_path == best and _pids(tmp_path, "test") == _pids(tmp_path, "fit")
    best_model, _ = _build(tmp_path)
    best_model.load_state_dict(torch.load(best, weights_only=True)["state_dict"])
    x, y = _data().tensors
    with torch.no_grad():
        assert tested[0]["test_loss"] == pytest.approx(float(nn.functional.mse_loss(best_model.layer(x), y)), rel=1e-5)
    trainer.strategy.stop_workers()


@pytest.mark.timeout(180)
def test_a_failed_stage_leaves_the_trainer_usable(tmp_path: Path, ranks: str) -> None:
    model, recorder = _build(tmp_path, fail_on_rank=1)
    trainer = _trainer(tmp_path, recorder)
    with pytest.raises(WorkerFailedError, match=r"^\[rank: 1\] worker failed: ValueError: planted failure on rank 1"):
        trainer.fit(model, _loader(), _loader())
    failed_worker = _pids(tmp_path, "fit")[1]
    assert not alive(failed_worker)  # the failure ended the whole pool
    tested = trainer.test(model, _loader())  # a fresh pool (and process group) serves the next stage
    assert _pids(tmp_path, "test")[1] != failed_worker and tested[0]["test_loss"] > 0
    trainer.strategy.stop_workers()


@pytest.mark.timeout(180)
def test_rank_zeros_own_error_stops_the_workers_and_keeps_its_type(tmp_path: Path, ranks: str) -> None:
    """An exception of rank 0 is the caller's own: it goes on as it is (as on one process, or under
    Lightning's ddp), the workers it left waiting in a collective are stopped, and the next stage runs."""
    model, recorder = _build(tmp_path, fail_on_rank=0)
    trainer = _trainer(tmp_path, recorder)
    with pytest.raises(ValueError, match="planted failure on rank 0"):
        trainer.fit(model, _loader(), _loader())
    assert wait_until_ended([_pids(tmp_path, "fit")[1]], PROMPT_S) == []
    model.zero_grad()
    model.layer(torch.ones(1, 4)).sum().backward()  # the failed stage's reducer left no hook on the module
    assert torch.equal(model.layer.bias.grad, torch.ones(1)) and not torch.distributed.is_initialized()
    tested = trainer.test(model, _loader())
    assert tested[0]["test_loss"] > 0
    trainer.strategy.stop_workers()


# Run as `python - < script`: its __main__ has no file, like a notebook's, so neither spawn nor a
# forkserver can re-import these classes; they travel by value.
NOTEBOOK = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from trainer import LightningModule, Trainer

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 1)
        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()
        def test_step(self, batch, batch_idx):
            Path(sys.argv[1], f"{self.global_rank}.pid").write_text(str(os.getpid()))
            self.log("out", self.layer(batch[0]).mean(), sync_dist=True)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    trainer = Trainer(strategy=sys.argv[2], accelerator="cpu", devices=2, max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), loader)
    trainer.test(trainer.lightning_module, loader)
    print("READY", flush=True)
    time.sleep(float(sys.argv[3]))  # between stages: the workers wait for the next one
""")


def _run_notebook(tmp_path: Path, strategy: str, sleep_s: float, ranks: str = "fork") -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": THREADS[ranks]}
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK)
    with script.open() as stdin:
        return subprocess.Popen([sys.executable, "-", str(tmp_path), strategy, str(sleep_s)], cwd=REPO, env=env,
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["ddp_notebook", "ddp_spawn"])
def test_classes_of_a_main_without_a_file_train_on_two_processes(tmp_path: Path, strategy: str) -> None:
    process = _run_notebook(tmp_path, strategy, 0)
    out, err = process.communicate(timeout=150)
    assert process.returncode == 0, err
    assert "READY" in out and len(list(tmp_path.glob("*.pid"))) == 2
    assert not [pid for pid in (int(p.read_text()) for p in tmp_path.glob("*.pid")) if alive(pid)]
    assert int((tmp_path / "0.pid").read_text()) == process.pid  # rank 0 ran in the script's own process


@pytest.mark.timeout(180)
def test_workers_waiting_between_stages_end_when_their_launcher_is_killed(tmp_path: Path) -> None:
    process = _run_notebook(tmp_path, "ddp", 120, ranks="pool")
    try:
        assert process.stdout is not None
        assert any("READY" in line for line in iter(process.stdout.readline, "")), "the stages never finished"
        worker = int((tmp_path / "1.pid").read_text())
        assert alive(worker)  # kept for the next stage
        process.kill()
        process.wait()
        assert not wait_until_ended([worker], PROMPT_S)
    finally:
        process.kill()


class HoldsALock(Callback):
    def __init__(self) -> None:
        self.guard = threading.Lock()


@pytest.mark.timeout(60)
def test_every_object_that_cannot_reach_the_pool_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ranks are not forked, a callback holding a lock and a module holding a socket cannot be
    sent to rank 1: the error names both paths and says what to change, before any worker starts."""
    monkeypatch.setenv("OMP_NUM_THREADS", THREADS["pool"])
    model, _ = _build(tmp_path)
    with socket.socket() as sock:
        model.sock = sock
        trainer = _trainer(tmp_path, HoldsALock())
        with pytest.raises(TypeError) as raised:
            trainer.fit(model, _loader(), _loader())
    message = str(raised.value)
    assert "trainer.callback_list.callbacks[0].guard (lock)" in message and "model.sock (socket)" in message
    assert "each rank gets 2 CPU threads" in message and "inside a hook" in message
    assert trainer.state.status == "interrupted"


@pytest.mark.timeout(120)
def test_objects_only_a_fork_carries_train_on_forked_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As under Lightning's ddp_notebook: a module holding a socket and a generator, a callback holding
    a lock train, and rank 1 saw the same objects (its own copies, inherited by the fork)."""
    monkeypatch.setenv("OMP_NUM_THREADS", THREADS["fork"])
    model, recorder = _build(tmp_path)
    with socket.socket() as sock:
        model.sock, model.draws = sock, (i for i in range(3))
        trainer = _trainer(tmp_path, HoldsALock())
        trainer.fit(model, _loader(), _loader())
    assert trainer.state.status == "finished" and trainer.global_step == 9
    assert next(model.draws) == 0  # rank 0's generator: nothing pickled or drew from it
