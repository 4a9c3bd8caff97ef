"""CPU ranks keep freed memory for the next step (strategies/cpu_memory.py), each case in a fresh process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[3]
_PROGRAM = """
import json, resource, sys
import torch
from strategies.cpu_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():  # what a training step does with its gradients: 24 MiB allocated, written, freed
    grads = [torch.empty(2**20 * 2) for _ in range(3)]
    for grad in grads:
        grad.fill_(1.0)
for _ in range(10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
print(json.dumps({"applied": applied, "faults_per_step": faults, "again": keep_freed_memory()}))
"""

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc switches")


def _run(mode: str, **environment: str) -> dict[str, float]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    env.update(environment, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _PROGRAM, mode], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.timeout(150)
def test_freed_blocks_are_reused_without_page_faults() -> None:
    kept = _run("keep")
    assert kept["applied"] is True and kept["again"] is True
    assert kept["faults_per_step"] < 50  # 24 MiB a step would be 6,144 faults if it were given back


@pytest.mark.timeout(150)
def test_a_users_own_malloc_setting_is_left_alone() -> None:
    # glibc's fixed default threshold: every 8 MiB block is unmapped when freed and faulted in again.
    result = _run("keep", MALLOC_MMAP_THRESHOLD_="131072")
    assert result["applied"] is False and result["faults_per_step"] > 6000
    assert _run("keep", GLIBC_TUNABLES="glibc.malloc.trim_threshold=0")["applied"] is False
