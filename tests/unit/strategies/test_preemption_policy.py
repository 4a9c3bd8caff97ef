"""PreemptionPolicy's checks, and the stop agreement between ranks through a real TCPStore."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import pytest
import torch.distributed as dist

from strategies import DDPStrategy, SingleDeviceStrategy
from strategies.preemption import PreemptionPolicy
from strategies.slurm_requeue import slurm_job_id
from strategies.stop_agreement import StopAgreement, reads_every


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


def _ranks(count: int, every: int = 1) -> tuple[list[StopAgreement], object]:
    server = dist.TCPStore("127.0.0.1", 0, count, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    clients = [dist.TCPStore("127.0.0.1", server.port, count, is_master=False, timeout=timedelta(seconds=30))
               for _ in range(count)]
    return [StopAgreement(store, "test/stop_after", rank, every) for rank, store in enumerate(clients)], server


def test_ranks_agree_on_the_step_after_the_first_notice() -> None:
    (rank0, rank1), _server = _ranks(2)
    assert not rank0.due(3, None)  # rank 0 passed boundary 3 before anyone knew
    assert not rank1.due(3, "SIGTERM")  # rank 1 holds a notice at its boundary 3: publishes "stop at 4"
    assert rank1.stop_after == 4 and rank1.signal_name == "SIGTERM"  # rank 0 cannot be past 4 yet
    assert rank0.due(4, None) and rank1.due(4, None)
    assert rank0.stop_after == rank1.stop_after == 4


def test_the_first_publication_wins() -> None:
    (rank0, rank1), _server = _ranks(2)
    assert not rank0.due(6, "SIGUSR1")  # publishes 7 first
    assert not rank1.due(6, "SIGTERM")  # its own 7 loses to rank 0's (same value, rank 0's signal)
    assert rank0.due(7, None) and rank1.due(7, None) and rank1.signal_name == "SIGUSR1"


def test_one_process_stops_at_the_boundary_it_sees_the_notice() -> None:
    alone = StopAgreement()
    assert not alone.due(2, None)
    assert alone.due(3, "SIGTERM") and alone.stop_after == 3


def test_a_large_job_staggers_its_reads() -> None:
    assert [reads_every(n) for n in (1, 2, 128, 129, 1024)] == [1, 1, 1, 2, 8]
    (rank0, rank1), _server = _ranks(2, every=4)
    assert not rank1.due(5, "SIGTERM") and rank1.stop_after == 9  # 5 + every
    assert not rank0.due(6, None) and rank0.stop_after is not None  # its window changed: it read


@pytest.mark.parametrize("seed", range(40))
def test_every_rank_stops_at_the_same_boundary_under_any_interleaving(seed: int) -> None:
    """Ranks run their boundaries in lockstep windows (a rank starts boundary i+1 only after every rank
    finished boundary i: the all-reduce or barrier between them), in a random order inside each window;
    steps may jump (several optimizers per batch); one or more ranks get a notice at random moments.
    Every rank must stop at the same boundary, at or after the first notice."""
    chooser = random.Random(seed)
    world, every = chooser.choice([2, 3, 5]), chooser.choice([1, 2, 3, 4])
    store = dist.HashStore()  # one in-process store: the same compare_set/check/get as the rendezvous store
    ranks = [StopAgreement(store, "test/stop_after", rank, every) for rank in range(world)]
    boundaries = list(itertools.accumulate(chooser.choice([1, 1, 1, 2, 3]) for _ in range(40)))
    notices = {rank: chooser.randrange(len(boundaries) // 2) for rank in chooser.sample(range(world),
                                                                                       chooser.randint(1, world))}
    stopped: dict[int, int] = {}
    for index, stepped in enumerate(boundaries):
        order = list(range(world))
        chooser.shuffle(order)
        for rank in order:
            if rank in stopped:
                continue
            notice = "SIGTERM" if rank in notices and notices[rank] <= index else None
            if ranks[rank].due(stepped, notice):
                stopped[rank] = index
        if stopped:
            break
    assert sorted(stopped) == list(range(world)) and len(set(stopped.values())) == 1, (stopped, notices)
    assert min(notices.values()) <= next(iter(stopped.values()))
