"""`scontrol requeue` for the job this process belongs to (a preempted SLURM job asks to run again)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes: an array task's "<array job>_<task>", else the job's."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def requeue_slurm_job() -> bool:
    """`scontrol requeue <job>`; True when it succeeded. A failure is reported, not raised: the
    checkpoint is written either way, and the job can be resubmitted by hand."""
    job_id = slurm_job_id()
    if job_id is None or not re.fullmatch(r"[0-9_]+", job_id):
        print(f"preemption: cannot requeue: SLURM job id {job_id!r} is missing or malformed.", file=sys.stderr)
        return False
    if shutil.which("scontrol") is None:
        print("preemption: cannot requeue: `scontrol` is not on PATH.", file=sys.stderr)
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"preemption: `scontrol requeue {job_id}` failed: {error}", file=sys.stderr)
        return False
    if result.returncode != 0:
        print(f"preemption: `scontrol requeue {job_id}` exited {result.returncode}: {result.stderr.strip()}",
              file=sys.stderr)
        return False
    print(f"preemption: SLURM job {job_id} requeued.", file=sys.stderr, flush=True)
    return True
