"""Which error the caller gets when a worker failed too (strategies/worker_failure.py)."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from strategies import hang_guard
from strategies.hang_guard import write_failure_stamp
from strategies.worker_failure import StageInterrupted, WorkerFailedError, failed_alike, first_failure


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


class NotAValueError(Exception):
    """Another type whose name ends like a builtin's."""


def test_only_the_whole_last_line_matches() -> None:
    worker = _as_a_worker_reports(NotAValueError("bad batch"))
    assert not failed_alike(ValueError("bad batch"), worker)


def test_a_peer_gone_error_on_every_rank_stays_the_workers_failure() -> None:
    # Rank 2 died: rank 0 and rank 1 both lose their connection to it, with the same text (the address is
    # rank 2's). That is no check failing alike on every rank but the symptom of a death: it must stay a
    # WorkerFailedError, which `max_restarts` restarts, not become rank 0's own error, which ends the fit.
    gone = "[../third_party/gloo/gloo/transport/tcp/pair.cc:538] Connection closed by peer [127.0.0.1]:40123"
    worker = _as_a_worker_reports(RuntimeError(gone))
    assert not failed_alike(RuntimeError(gone), worker)
    assert not failed_alike(ConnectionResetError("reset"), _as_a_worker_reports(ConnectionResetError("reset")))


def test_a_stamp_is_never_seen_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 reads the stamps once one `*.json` exists and kills the workers then: a worker killed while
    writing its stamp must leave none, not an empty one (json.loads of it raised JSONDecodeError in place of
    the failure, seen in Lightning's test_trainer_spike_detection_integration[1-2--inf-False])."""

    def killed_before_the_rename(*_args: object) -> None:
        raise KeyboardInterrupt  # stands for the SIGKILL

    monkeypatch.setattr(hang_guard.os, "replace", killed_before_the_rename)
    with pytest.raises(KeyboardInterrupt):
        write_failure_stamp(tmp_path, "Traceback ...\nFloatingPointError: step 4", rank=1)
    assert list(tmp_path.glob("*.json")) == []
    monkeypatch.undo()
    write_failure_stamp(tmp_path, "Traceback ...\nFloatingPointError: step 4", rank=1)
    failure = first_failure({}, tmp_path)
    assert failure.rank == 1 and failure.traceback == "Traceback ...\nFloatingPointError: step 4"
