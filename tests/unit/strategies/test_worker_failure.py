"""Which error the caller gets when a worker failed too (strategies/worker_failure.py)."""

from __future__ import annotations

import traceback

from strategies.worker_failure import StageInterrupted, WorkerFailedError, failed_alike


def _as_a_worker_reports(error: BaseException) -> WorkerFailedError:
    try:
        raise error
    except BaseException:  # noqa: BLE001 - formatted as a worker's stamp is
        text = traceback.format_exc()
    return WorkerFailedError(1, f"worker failed: {text.splitlines()[-1]}", traceback=text)


def test_the_same_check_failing_on_every_rank_leaves_rank_zeros_own_error() -> None:
    worker = _as_a_worker_reports(FloatingPointError("step 3, epoch 0: gradients are NaN/inf"))
    assert failed_alike(FloatingPointError("step 3, epoch 0: gradients are NaN/inf"), worker)
    multi_line = _as_a_worker_reports(ValueError("bad batch\nat index 4"))
    assert failed_alike(ValueError("bad batch\nat index 4"), multi_line)


def test_a_different_error_or_an_interrupted_stage_is_the_workers_failure() -> None:
    worker = _as_a_worker_reports(FloatingPointError("step 3, epoch 0: gradients are NaN/inf"))
    assert not failed_alike(FloatingPointError("step 4, epoch 0: gradients are NaN/inf"), worker)
    assert not failed_alike(ValueError("step 3, epoch 0: gradients are NaN/inf"), worker)
    assert not failed_alike(StageInterrupted(), worker)
    assert not failed_alike(FloatingPointError("x"), WorkerFailedError(1, "killed by SIGKILL", traceback=None))
