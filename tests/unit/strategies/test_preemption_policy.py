"""PreemptionPolicy's checks, and the stop agreement between ranks through a real TCPStore."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from strategies import DDPStrategy, SingleDeviceStrategy
from strategies.preemption import PreemptionPolicy, SignalFlag, StopAgreement, reads_every, slurm_job_id


@pytest.mark.parametrize(("value", "message"), [
    ({"signals": ["SIGFOO"]}, "preemption signal 'SIGFOO' is not a signal of this platform"),
    ({"signals": ["SIGKILL"]}, "preemption signal SIGKILL cannot be caught"),
    ({"signals": ["INT"]}, "preemption signal SIGINT is Ctrl-C"),
    ({"grace_period_s": 0}, "grace_period_s must be a number of seconds > 0, got 0"),
    ({"grace_period_s": "soon"}, "grace_period_s must be a number of seconds > 0, got 'soon'"),
    ({"requeue": "yes"}, "requeue='yes' is not one of"),
    ({"requeue": 1}, "requeue=1 is not one of"),
    ({"grace": 5}, "preemption has no setting 'grace'"),
    ("on", "must be a PreemptionPolicy, a dict of its settings, True or False"),
])
def test_bad_settings_are_named(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        DDPStrategy(preemption=value)  # type: ignore[arg-type]


def test_settings_normalise_and_turn_off() -> None:
    policy = PreemptionPolicy.from_argument({"signals": ["term", 10, "SIGUSR2"], "grace_period_s": 5, "requeue": False})
    assert policy.signals == ("SIGTERM", "SIGUSR1", "SIGUSR2") and policy.grace_period_s == 5
    assert not policy.should_requeue()
    assert SingleDeviceStrategy().preemption == PreemptionPolicy()  # SIGTERM, SIGUSR1, 25 s, auto
    assert not DDPStrategy(preemption=False).preemption.enabled


def test_requeue_auto_means_on_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    assert not PreemptionPolicy().should_requeue() and slurm_job_id() is None
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert PreemptionPolicy().should_requeue() and slurm_job_id() == "77"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "70")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert slurm_job_id() == "70_3"  # scontrol requeue takes the array task's id


def _ranks(count: int) -> list[StopAgreement]:
    server = dist.TCPStore("127.0.0.1", 0, count, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    clients = [dist.TCPStore("127.0.0.1", server.port, count, is_master=False, timeout=timedelta(seconds=30))
               for _ in range(count)]
    return [StopAgreement(SignalFlag(PreemptionPolicy()), store, key="test/stop_after") for store in clients] + [server]


def test_ranks_agree_on_the_step_after_the_first_notice() -> None:
    rank0, rank1, _server = _ranks(2)
    assert not rank0.due(3)  # rank 0 passed boundary 3 before anyone knew
    rank1.flag.received = "SIGTERM"  # rank 1 learns of it at its boundary 3
    assert not rank1.due(3)  # ... and publishes "stop after step 4": rank 0 cannot be past 4 yet
    assert rank1.stop_after == 4 and rank1.signal_name == "SIGTERM"
    assert not rank0.due(3) and rank0.due(4) and rank1.due(4)
    assert rank0.stop_after == rank1.stop_after == 4


def test_the_first_publication_wins() -> None:
    rank0, rank1, _server = _ranks(2)
    rank0.flag.received, rank1.flag.received = "SIGUSR1", "SIGTERM"
    assert not rank0.due(6)  # publishes 7 first
    assert not rank1.due(6)  # its own 7 loses to rank 0's (same value, rank 0's signal)
    assert rank0.due(7) and rank1.due(7) and rank1.signal_name == "SIGUSR1"


def test_one_process_stops_at_the_boundary_it_sees_the_notice() -> None:
    alone = StopAgreement(SignalFlag(PreemptionPolicy()))
    assert not alone.due(2)
    alone.flag.received = "SIGTERM"
    assert alone.due(3) and alone.stop_after == 3


def test_a_large_job_reads_the_store_every_few_steps_and_still_agrees() -> None:
    assert [reads_every(n) for n in (1, 2, 64, 65, 1024)] == [1, 1, 1, 2, 16]
    rank0, rank1, _server = _ranks(2)
    rank0.every = rank1.every = 4
    rank1.flag.received = "SIGTERM"
    assert not rank1.due(5) and rank1.stop_after == 8  # the next read step at or after 6
    assert not rank0.due(5) and rank0.stop_after is None  # 5 is no read step: the store is not asked
    assert not rank0.due(6) and not rank0.due(7) and rank0.due(8) and rank1.due(8)
