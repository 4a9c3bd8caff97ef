"""A torch.compile'd module inside pytorch_lightning.Trainer with our LightningDDPStrategy (#18):
it trains compiled, its graph split at our bucket boundaries in each rank, to the same weights as
Lightning's own "ddp" (torch DDP, whose graph dynamo splits at torch DDP's buckets)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.compile_backends import LOG_VARIABLE, graphs_compiled

ROOT = Path(__file__).parents[2]


def _fit(mode: str, out: Path) -> tuple[dict[str, torch.Tensor], dict[int, int]]:
    out.mkdir()
    log = out / "graphs.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), LOG_VARIABLE: str(log)}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "lightning_compiled.py"), mode, str(out)],
                          cwd=out, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out / "weights.pt", weights_only=True), graphs_compiled(log)


@pytest.mark.conformance  # two compiled 2-process fits (~25 s); tests/distributed/test_compiled.py keeps ours in make test
@pytest.mark.timeout(300)
def test_compiled_module_in_lightnings_trainer_splits_at_our_buckets_and_matches_lightning_ddp(
        tmp_path: Path) -> None:
    ours, our_graphs = _fit("ours", tmp_path / "ours")
    theirs, their_graphs = _fit("ddp", tmp_path / "ddp")
    assert set(our_graphs) == {0, 1} and min(our_graphs.values()) >= 2  # compiled, in pieces, on each rank
    assert set(their_graphs) == {0, 1}
    for key, value in theirs.items():
        assert torch.allclose(ours[key], value, atol=1e-6, rtol=0), key
