"""Batched metric sync: every sync_dist value due at one sync point travels in ONE collective.

A fake reduce stands in for N ranks: it records each call and returns what the sum over the
ranks would be (each rank's vector given explicitly), so exactness can be checked too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from trainer.logged_metrics import MetricStore


class FakeRanks:
    """Rank 0 of `world_size`; `others` are the vectors the other ranks contribute."""

    def __init__(self, world_size: int = 2) -> None:
        self.global_rank, self.world_size = 0, world_size
        self.calls: list[tuple[str, int]] = []
        self.others: Callable[[torch.Tensor], list[torch.Tensor]] = lambda mine: [mine] * (world_size - 1)

    def reduce(self, tensor: torch.Tensor, reduce_op: str) -> torch.Tensor:
        self.calls.append((reduce_op, tensor.numel()))
        stacked = torch.stack([tensor, *self.others(tensor)])
        return {"sum": stacked.sum(0), "max": stacked.max(0).values, "min": stacked.min(0).values}[reduce_op]


def _store(ranks: FakeRanks, with_ranks: bool = True) -> MetricStore:
    return MetricStore(ranks.reduce, ranks=ranks if with_ranks else None)


def test_epoch_end_sends_every_key_in_one_collective() -> None:
    ranks = FakeRanks()
    store = _store(ranks)
    for name in ("a", "b", "c", "d"):
        store.log("validation_step", name, 2.0, sync_dist=True, batch_size=3)
    store.log("validation_step", "s", 5.0, sync_dist=True, reduce_fx="sum")
    store.log("validation_step", "local", 7.0)  # no sync_dist: not in the collective
    store.compute_epoch("validate")
    assert ranks.calls == [("sum", 4 * 2 + 1)]  # (total, weight) per mean key + one sum
    assert float(store.callback_metrics["a"]) == 2.0 and float(store.callback_metrics["s"]) == 10.0
    assert float(store.callback_metrics["local"]) == 7.0


def test_max_and_min_share_the_collective_and_are_exact() -> None:
    ranks = FakeRanks(world_size=3)
    # rank 0 logs (mean 1.0, max 4.0, min 4.0); the other ranks' vectors are built by rank position.
    ranks.others = lambda mine: [_as_rank(mine, 1, mean=3.0, extreme=9.0), _as_rank(mine, 2, mean=5.0, extreme=-2.0)]
    store = _store(ranks)
    store.log("validation_step", "hi", 4.0, sync_dist=True, reduce_fx="max")
    store.log("validation_step", "lo", 4.0, sync_dist=True, reduce_fx="min")
    store.log("validation_step", "m", 1.0, sync_dist=True, batch_size=1)
    store.compute_epoch("validate")
    assert ranks.calls == [("sum", 2 + 3 * 2)]  # m's (total, weight) + a (3 ranks x 2) block for hi/lo
    assert float(store.callback_metrics["hi"]) == 9.0 and float(store.callback_metrics["lo"]) == -2.0
    assert float(store.callback_metrics["m"]) == 3.0  # (1 + 3 + 5) / 3


def _as_rank(mine: torch.Tensor, rank: int, mean: float, extreme: float) -> torch.Tensor:
    """What rank `rank` sends for the layout [m.total, m.weight | 3 x (hi, lo)]."""
    other = torch.zeros_like(mine)
    other[0], other[1] = mean, 1.0
    other[2 + 2 * rank: 4 + 2 * rank] = extreme
    return other


def test_without_rank_information_max_min_take_one_more_collective() -> None:
    ranks = FakeRanks()
    store = _store(ranks, with_ranks=False)
    store.log("validation_step", "hi", 4.0, sync_dist=True, reduce_fx="max")
    store.log("validation_step", "lo", 1.0, sync_dist=True, reduce_fx="min")
    store.log("validation_step", "m", 1.0, sync_dist=True)
    store.compute_epoch("validate")
    assert ranks.calls == [("sum", 2), ("max", 2)]
    assert (float(store.callback_metrics["hi"]), float(store.callback_metrics["lo"])) == (4.0, 1.0)


def test_training_step_values_wait_for_sync_pending_then_go_together() -> None:
    ranks = FakeRanks()
    # Rank 1 sends [its count 1, acc 0.5, loss 5 | row 0 empty, row 1: peak 6] (keys in sorted order).
    ranks.others = lambda mine: [torch.tensor([1.0, 0.5, 5.0, 0.0, 6.0], dtype=torch.float64)]
    store = _store(ranks)
    store.log("training_step", "loss", 3.0, sync_dist=True)
    store.log("training_step", "acc", 0.5, sync_dist=True)
    store.log("on_train_batch_end", "peak", 8.0, on_step=True, sync_dist=True, reduce_fx="max")
    assert ranks.calls == [] and "loss" not in store.callback_metrics  # nothing half-synced is visible
    store.sync_pending()
    assert ranks.calls == [("sum", 1 + 2 + 2)]  # rank count + 2 means, plus a 2-rank block for the max
    assert store.pop_logger_metrics() == {"acc": 0.5, "loss": 4.0, "peak": 8.0}
    store.sync_pending()
    assert len(ranks.calls) == 1  # nothing pending: no collective


def test_epoch_end_flushes_pending_step_values_first() -> None:
    ranks = FakeRanks()
    store = _store(ranks)
    store.log("training_step", "loss", 2.0, on_step=True, on_epoch=True, sync_dist=True)
    store.compute_epoch("train")
    assert ranks.calls == [("sum", 2), ("sum", 2)]  # the step flush, then the epoch value
    assert store.pop_logger_metrics() == {"loss_step": 2.0, "loss_epoch": 2.0}


def test_step_level_sync_in_evaluation_stays_local_with_one_warning() -> None:
    ranks = FakeRanks()
    store = _store(ranks)
    with pytest.warns(UserWarning, match="this rank's own"):
        store.log("validation_step", "v", 1.0, on_step=True, sync_dist=True, batch_size=1)
    store.log("validation_step", "v", 3.0, on_step=True, sync_dist=True, batch_size=1)  # warned once only
    assert ranks.calls == []  # no per-batch collective: shards may be uneven
    # Lightning: an evaluation step value goes to the logger, one row per batch, not to callback_metrics
    assert "v_step" not in store.callback_metrics and store.pop_eval_step_metrics() == {"v_step": 3.0}
    store.compute_epoch("validate")
    assert ranks.calls == [("sum", 2)] and float(store.callback_metrics["v_epoch"]) == 2.0


def test_weighted_sum_not_mean_of_means() -> None:
    """Rank 0: one batch of 3 with mean 1; rank 1: one batch of 1 with mean 5. Global mean of the
    4 samples is 2, where a mean of the two rank means would say 3."""
    ranks = FakeRanks()
    ranks.others = lambda mine: [torch.tensor([5.0, 1.0], dtype=torch.float64)]
    store = _store(ranks)
    store.log("validation_step", "v", 1.0, sync_dist=True, batch_size=3)
    store.compute_epoch("validate")
    assert float(store.callback_metrics["v"]) == 2.0
