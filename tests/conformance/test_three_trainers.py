"""Three Trainers in one script (#36): the weights and the logged epochs of each fit agree between our
Trainer and Lightning's (`lightning.pytorch` and `pytorch_lightning`, `strategy="ddp"`, 2 CPU
processes), whether our ranks 1.. were forked from the caller or started from a forkserver. Each run is a
script of its own: Lightning's `ddp` starts rank 1 by running the command line again. Slow: selected with
`-m conformance` (make conformance)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5  # relative: two reducers average the same gradients in another summation order


def _run(kind: str, out: Path, threads: str = "1") -> dict[str, Any]:
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": threads}
    done = subprocess.run([sys.executable, "-m", "tests.conformance.three_trainers_script", kind, str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    fits: dict[str, Any] = json.loads(Path(out, "fits.json").read_text())
    return fits


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, str):
        try:
            return _close(float(a), float(b))
        except ValueError:
            return bool(a == b)
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a))


@pytest.mark.conformance
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lightning", ["lightning", "pytorch_lightning"])
def test_three_trainers_in_one_script_match_lightning(tmp_path: Path, lightning: str) -> None:
    theirs = _run(lightning, tmp_path / lightning)
    forked = _run("ours", tmp_path / "forked", threads="1")
    pooled = _run("ours", tmp_path / "pooled", threads="2") if lightning == "lightning" else forked
    assert list(theirs) == list(forked) == ["4", "8", "16"]
    for ours in (forked, pooled):
        for width, fit in theirs.items():
            assert ours[width]["global_step"] == fit["global_step"]
            for name, tensor in fit["weights"].items():
                assert _close(tensor, ours[width]["weights"][name]), f"width {width}: {name} differs"
            assert [sorted(row) for row in ours[width]["logged"]] == [sorted(row) for row in fit["logged"]]
            for mine, row in zip(ours[width]["logged"], fit["logged"]):
                assert all(_close(row[key], mine[key]) for key in row), f"width {width}: {mine} != {row}"
