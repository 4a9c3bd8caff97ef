"""Two "nodes" on this machine: two torchrun agents (`--nnodes 2 --nproc-per-node 1`) meeting at a
c10d rendezvous on 127.0.0.1, each running this file as the training script.

The run must end with identical parameters on both ranks (each rank writes its weights to a
file), equal to one process trained on the global batch; a Trainer whose devices disagree with
the launch must fail fast on both nodes with the pre-flight message instead of hanging.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.spawn import free_port

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _fit(devices: int, num_nodes: int, out_dir: str | None = None) -> torch.nn.Module:
    """The tiny training job; under torchrun each rank runs it and saves its weights."""
    from tests.helpers.models import RegressionData, TinyRegressor
    from trainer import Trainer

    torch.manual_seed(0)
    model = TinyRegressor(optimizer="adam", lr=0.02)
    trainer = Trainer(accelerator="cpu", devices=devices, num_nodes=num_nodes, strategy="ddp" if out_dir else "single",
                      max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(model, datamodule=RegressionData(batch_size=8 if out_dir else 16, global_order=out_dir is None))
    if out_dir is not None:
        torch.save(model.state_dict(), Path(out_dir, f"rank{trainer.global_rank}-of-{trainer.world_size}.pt"))
    return model


def _launch_two_nodes(tmp_path: Path, devices: int, timeout: float = 90) -> list[subprocess.CompletedProcess[str]]:
    if not TORCHRUN.exists():
        pytest.skip("torchrun is not installed next to this Python")
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(
        [str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-backend", "c10d",
         "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes", "--local-addr", "127.0.0.1", "--max-restarts", "0",
         "--monitor-interval", "0.1", __file__, str(tmp_path), str(devices)],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        for node in (0, 1)]
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:  # a hang must not outlive the test: kill each agent's whole session
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    return results


@pytest.mark.timeout(150)
@pytest.mark.conformance
def test_two_nodes_finish_with_identical_parameters(tmp_path: Path) -> None:
    results = _launch_two_nodes(tmp_path, devices=1)
    for node, result in enumerate(results):
        assert result.returncode == 0, f"node {node} failed:\n{result.stderr[-4000:]}"
    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}-of-2.pt", weights_only=True) for rank in (0, 1))
    assert rank0.keys() == rank1.keys()
    assert all(torch.equal(rank0[name], rank1[name]) for name in rank0)
    single = _fit(devices=1, num_nodes=1).state_dict()  # one process on the global batch of 16
    assert max((rank0[name] - single[name]).abs().max().item() for name in single) < 1e-5


@pytest.mark.timeout(150)
@pytest.mark.conformance
def test_devices_mismatch_fails_fast_with_the_preflight_message(tmp_path: Path) -> None:
    started = time.monotonic()
    results = _launch_two_nodes(tmp_path, devices=2)  # Trainer(devices=2) but 1 process per node
    for node, result in enumerate(results):
        assert result.returncode != 0, f"node {node} should have failed:\n{result.stderr[-2000:]}"
        assert "LOCAL_WORLD_SIZE=1" in result.stderr and "--nproc-per-node=2" in result.stderr, result.stderr[-3000:]
    assert time.monotonic() - started < 60  # failed before any rendezvous wait, not by a timeout


if __name__ == "__main__":  # what each torchrun worker runs: <out_dir> <devices>
    _fit(devices=int(sys.argv[2]), num_nodes=2, out_dir=sys.argv[1])
