"""The hang guard's verdicts on synthetic peer reports, and its knobs' validation (no processes)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch.distributed as dist

from strategies import DDPStrategy
from strategies.hang_guard import LEDGER, HangGuard, RankReport, main_thread_site


def _guard(stall_timeout: float = 20.0) -> HangGuard:
    return HangGuard(dist.HashStore(), rank=0, world_size=2, stall_timeout=stall_timeout)


def _waiting(rank: int, seq: int, op: str, waited: float, beat: int = 1) -> RankReport:
    return RankReport(rank=rank, beat=beat, seq=seq, op=op, waiting_s=waited, site="train.py:1 in step")


def test_same_collective_is_not_a_verdict_however_long() -> None:
    guard = _guard()
    mine = _waiting(0, 5, "all_reduce(mean)", 500.0)
    assert guard._diagnose(mine, {1: _waiting(1, 5, "all_reduce(mean)", 500.0)}) is None


def test_a_different_collective_needs_two_polls_to_be_a_verdict() -> None:
    guard = _guard()
    mine = _waiting(0, 5, "all_reduce(mean)", 12.0)
    peer = {1: _waiting(1, 5, "barrier", 12.0)}
    assert guard._diagnose(mine, peer) is None  # a stale report could show a transient state
    verdict = guard._diagnose(mine, {1: _waiting(1, 5, "barrier", 13.0, beat=2)})
    assert verdict is not None and "rank 1 waits in collective #5 barrier" in verdict


def test_a_finished_peer_is_a_verdict_at_once() -> None:
    peer = RankReport(rank=1, beat=3, seq=4, op="barrier(teardown)", done=True)
    verdict = _guard()._diagnose(_waiting(0, 5, "all_reduce(sum)", 11.0), {1: peer})
    assert verdict is not None and "rank 1 has finished the stage after collective #4" in verdict


def test_a_verdict_on_a_snapshot_this_rank_has_left_is_dropped() -> None:
    """The race a busy machine showed: rank 1's watchdog took its snapshot in barrier #1, its main thread then
    passed #1 and #2 and rank 0 finished the stage, and only then were the peers read."""
    guard = _guard()
    with LEDGER.collective("barrier(save_checkpoint)"):
        mine = LEDGER.report(0, 1)
        assert guard._still_in(mine)
    with LEDGER.collective("barrier(teardown)"):
        assert not guard._still_in(mine)  # moved on: whatever the peers say now, it is not about `mine`
    assert not guard._still_in(mine)  # not waiting at all


def test_a_peer_still_between_stages_is_busy_not_finished() -> None:
    """Under torchrun, stages share processes: a peer whose last report is the previous stage's
    `done` is running user code between stages, which gets the stall timeout, not a verdict."""
    guard = _guard(stall_timeout=20.0)
    mine = RankReport(rank=0, beat=1, seq=9, op="all_gather", waiting_s=12.0, stage=2, site="x.py:1 in f")
    previous = RankReport(rank=1, beat=4, seq=8, op="barrier(teardown)", done=True, stage=1, site="x.py:5 in main")
    assert guard._diagnose(mine, {1: previous}) is None
    verdict = guard._diagnose(replace(mine, waiting_s=21.0), {1: previous})
    assert verdict is not None and "(between stages)" in verdict and "not in any collective" in verdict


def test_a_busy_peer_gets_until_the_stall_timeout_and_local_work_is_exempt() -> None:
    guard = _guard(stall_timeout=20.0)
    busy = RankReport(rank=1, beat=1, seq=4, op="barrier", site="train.py:9 in training_step")
    assert guard._diagnose(_waiting(0, 5, "all_reduce(mean)", 15.0), {1: busy}) is None
    verdict = guard._diagnose(_waiting(0, 5, "all_reduce(mean)", 21.0), {1: busy})
    assert verdict is not None and "now at train.py:9 in training_step" in verdict
    saving = RankReport(rank=1, beat=2, seq=4, op="barrier", local_work="saving checkpoint last.ckpt")
    assert guard._diagnose(_waiting(0, 5, "barrier(save_checkpoint)", 60.0), {1: saving}) is None


def test_a_peer_whose_reports_stop_changing_is_silent() -> None:
    guard = _guard(stall_timeout=0.05)
    frozen = RankReport(rank=1, beat=7, seq=5, op="all_reduce(mean)", waiting_s=1.0)
    mine = _waiting(0, 5, "all_reduce(mean)", 1.0)
    assert guard._diagnose(mine, {1: frozen}) is None
    import time

    time.sleep(0.1)
    verdict = guard._diagnose(mine, {1: frozen})
    assert verdict is not None and "rank 1 has not reported" in verdict


def test_main_thread_site_names_the_calling_test() -> None:
    assert "test_hang_guard.py" in main_thread_site() and "test_main_thread_site" in main_thread_site()


@pytest.mark.parametrize("value, error", [(0, ValueError), (-1.0, ValueError), ("soon", TypeError)])
def test_stall_timeout_must_be_positive_seconds(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="stall_timeout"):
        DDPStrategy(stall_timeout=value)  # type: ignore[arg-type]


def test_debug_collectives_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="debug_collectives"):
        DDPStrategy(debug_collectives="yes")  # type: ignore[arg-type]


def test_an_unexpected_error_in_the_watchdog_is_printed_once_and_it_keeps_watching(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    guard = HangGuard(dist.HashStore(), rank=1, world_size=2, stall_timeout=20.0, poll_s=0.01)
    polls: list[int] = []

    def broken_publish(done: bool = False) -> None:
        polls.append(1)
        raise KeyError("a bug in the diagnosis")

    monkeypatch.setattr(guard, "_publish", broken_publish)
    guard._thread.start()
    deadline = time.monotonic() + 5
    while len(polls) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    guard._stop_thread()
    err = capsys.readouterr().err
    assert len(polls) >= 5, "the watchdog went on polling after the error"
    assert err.count("hang guard: unexpected error in its watchdog") == 1 and "a bug in the diagnosis" in err
    assert "[rank: 1]" in err or "rank 1" in err
