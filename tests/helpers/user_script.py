"""Run a user's training script as a user would: `python train.py ARGS` in its own directory, with
this repository importable, so a Trainer inside launches its workers from a real `__main__` file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def run_user_script(directory: Path, source: str, *args: str, timeout_s: float = 150) -> None:
    """Write `source` to `directory/train.py`, run it with `args`, and fail with its stderr's end when it
    exits non-zero."""
    script = directory / "train.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script), *args], cwd=directory, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
