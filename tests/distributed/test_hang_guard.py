"""Ranks that stop meeting in the same collective end the job in seconds, named with their
operations and call sites, instead of blocking until the process-group timeout (10 min)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from strategies import DDPStrategy
from strategies.hang_guard import CollectiveMismatchError
from strategies.launcher import WorkerFailedError
from tests.helpers import hang_workers
from tests.helpers.models import RegressionData, SlowPrepareData, StallOnOneRank, SyncOnOneRank, TinyRegressor
from trainer import Trainer

pytestmark = pytest.mark.timeout(120)
STALL_S = 4.0


def _strategy(**kwargs: Any) -> DDPStrategy:
    strategy = DDPStrategy(stall_timeout=STALL_S, **kwargs)
    strategy.configure(accelerator="cpu", devices=2)
    return strategy


# A mismatch found by the debug fingerprints raises on every rank; rank 0's own (this process's) comes first.
JOB_ENDED = (WorkerFailedError, CollectiveMismatchError)


def _launch_failure(fn: Any, *args: Any, **strategy_kwargs: Any) -> tuple[str, float]:
    strategy = _strategy(**strategy_kwargs)
    started = time.monotonic()
    with pytest.raises(JOB_ENDED) as info:
        strategy.launch(fn, strategy, *args)
    return f"{type(info.value).__name__}: {info.value}", time.monotonic() - started


@pytest.mark.conformance
def test_ranks_in_different_collectives_end_the_job_naming_both() -> None:
    message, seconds = _launch_failure(hang_workers.extra_barrier_on_rank_zero)
    assert "hang guard" in message and "the ranks issued different collectives" in message
    assert "barrier(only rank zero)" in message and "all_reduce(mean)" in message
    assert "rank 0 waits" in message and "rank 1 waits" in message
    assert "hang_workers.py" in message and "extra_barrier_on_rank_zero" in message  # the call sites
    assert seconds < 30  # the timeout is 10 minutes


def test_a_rank_that_never_arrives_is_named_with_where_it_is() -> None:
    message, seconds = _launch_failure(hang_workers.rank_one_never_arrives)
    assert "rank 0 waits in collective" in message and "all_reduce(mean)" in message
    assert "rank 1 is not in any collective" in message and "in rank_one_never_arrives" in message
    assert "stall_timeout" in message
    assert STALL_S <= seconds < 30


def test_debug_fingerprints_name_the_first_mismatch_before_gloo_aborts() -> None:
    message, _ = _launch_failure(hang_workers.mismatched_shapes, debug_collectives=True)
    assert "CollectiveMismatchError" in message and "differs between ranks" in message
    assert "all_reduce(mean)[(1,) float32]" in message and "all_reduce(mean)[(3,) float32]" in message
    assert "in mismatched_shapes" in message


def test_debug_fingerprints_let_a_correct_program_through() -> None:
    strategy = _strategy(debug_collectives=True)
    assert strategy.launch(hang_workers.matched_collectives, strategy) == sum(2 * (2 * s + 1) for s in range(5))


@pytest.mark.conformance
def test_a_checkpoint_write_longer_than_the_stall_timeout_is_not_a_hang(tmp_path: Path) -> None:
    strategy = DDPStrategy(stall_timeout=2.0, checkpoint_io=hang_workers.SlowCheckpointIO(seconds=5.0))
    strategy.configure(accelerator="cpu", devices=2)
    assert strategy.launch(hang_workers.slow_checkpoint, strategy, str(tmp_path / "slow.ckpt"))


def _fit(model: Any, tmp_path: Path, strategy: DDPStrategy, data: Any = None) -> None:
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path)
    trainer.fit(model, datamodule=data or RegressionData(batch_size=4))


@pytest.mark.conformance
def test_a_long_prepare_data_on_rank_zero_is_not_a_hang(tmp_path: Path) -> None:
    _fit(TinyRegressor(), tmp_path, DDPStrategy(stall_timeout=2.0), SlowPrepareData(batch_size=4))


@pytest.mark.conformance
def test_a_training_step_stuck_on_one_rank_ends_the_fit(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        _fit(StallOnOneRank(), tmp_path, DDPStrategy(stall_timeout=STALL_S))
    message = str(info.value)
    assert "rank 1 is not in any collective" in message and "in training_step" in message
    assert "gradient all-reduce" in message  # what rank 0 waits for
    assert time.monotonic() - started < 60


def test_sync_dist_on_one_rank_is_named_with_debug_collectives(tmp_path: Path) -> None:
    with pytest.raises(JOB_ENDED) as info:
        _fit(SyncOnOneRank(), tmp_path, DDPStrategy(stall_timeout=STALL_S, debug_collectives=True))
    message = str(info.value)
    assert "differs between ranks" in message and "all_reduce(sum)" in message
    assert "gradient all-reduce" in message  # what rank 1 issued at the same position


@pytest.mark.conformance
def test_sync_dist_on_one_rank_without_debug_points_to_it(tmp_path: Path) -> None:
    """Gloo aborts the rank whose message sizes do not match; the report says what to do."""
    with pytest.raises(WorkerFailedError) as info:
        _fit(SyncOnOneRank(), tmp_path, DDPStrategy(stall_timeout=STALL_S, timeout=timedelta(seconds=60)))
    message = str(info.value)
    assert ("debug_collectives" in message) or ("hang guard" in message), message
