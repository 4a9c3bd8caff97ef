"""`benchmarks/op_count.py` and `step_overhead --count-ops`: the per-step launch counts #30 reads, with
each op charged to the code it came from (views and detach are no launch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.op_count import CountWindow, OpCounter, device_total, per_step

REPO = Path(__file__).parents[2]
COPIES = "reducer: gradient copied into its bucket"


def test_views_and_detach_are_no_launch_and_ops_are_charged_to_their_source() -> None:
    model = torch.nn.Linear(3, 2)
    counter = OpCounter()
    window = CountWindow(counter, start=1, steps=2)
    with counter:
        for step in range(4):
            window.at_step(step)
            loss = model(torch.ones(4, 3).view(2, 6).view(4, 3)).sum()
            loss.detach()
            loss.backward()
    table = per_step(counter.counts, steps=2)
    here = "test_op_count.py:test_views_and_detach_are_no_launch_and_ops_are_charged_to_their_source"
    assert set(table) == {"forward + loss", "backward", here}  # no frame of a rule: the innermost outside torch
    assert table[here] == {"ones": 1.0, "sum": 1.0} and table["forward + loss"] == {"addmm": 1.0}
    ops = {op for counts in table.values() for op in counts}
    assert not ops & {"view", "detach", "t", "expand", "_unsafe_view"}
    assert device_total(table) == sum(sum(ops.values()) for ops in table.values())


@pytest.mark.timeout(120)
def test_count_ops_shows_what_our_ddp_adds_to_a_plain_step(tmp_path: Path) -> None:
    out = tmp_path / "counts.json"
    command = [sys.executable, "-m", "benchmarks.step_overhead", "--model", "linear", "--gpu-settings", "--torch-ddp",
               "--count-ops", "3", "--warmup", "3", "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(out.read_text())["figures"]
    raw, ours, torch_ddp = counts["raw"], counts["ours"], counts["raw torch DDP"]
    for source in ("forward + loss", "backward", "optimizer step"):
        assert ours[source] == raw[source]  # the same arithmetic
    assert ours[COPIES] == {"copy_": 2.0}  # on a CPU each of the Linear's two gradients goes in as it arrives (#37)
    assert COPIES not in raw and COPIES not in torch_ddp
    assert torch_ddp["backward"]["copy_"] == 2.0  # torch DDP's C++ reducer copies too, inside backward
    assert "copy_" not in raw["backward"]
