"""bucket_cap_mb="auto": the tuner's schedule, the reducer switching plans (driven by CapTuning),
agreement across ranks, and the pick carried through DDPStrategy.state_dict()."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from strategies import DDPStrategy
from strategies.autotune import BucketAutotuner, CapTuning, autotuner_for, distinct_candidates, first_pass_cap_mb, \
    reducer_summary
from strategies.reducer import GradReducer
from tests.helpers.reducer_models import global_batch, identical_across_ranks, flat_params, reduced_backward, shard
from tests.helpers.spawn import run_on_ranks

KIB = 1024 / 2**20  # one KiB in MiB


# ---------------------------------------------------------------------- the pure state machine
def test_schedule_settles_then_measures_each_candidate_and_picks_the_fastest() -> None:
    tuner = BucketAutotuner([1.0, 4.0, 16.0], settle_steps=1, measure_steps=2)
    assert tuner.steps_needed == 9
    caps, switches = [], []
    times = {1.0: 0.30, 4.0: 0.10, 16.0: 0.20}
    for _ in range(tuner.steps_needed):
        caps.append(tuner.current_mb)
        switches.append(tuner.record(times[tuner.current_mb]))
    assert caps == [1.0] * 3 + [4.0] * 3 + [16.0] * 3
    assert switches == [False, False, True] * 3
    assert tuner.measured_all and not tuner.done
    assert tuner.samples == {1.0: [0.30, 0.30], 4.0: [0.10, 0.10], 16.0: [0.20, 0.20]}  # settle steps dropped
    assert tuner.agree(group=None, world_size=1) == 4.0
    assert tuner.done and tuner.current_mb == 4.0 and not tuner.record(1.0)
    assert tuner.summary() == {"candidates_mb": [1.0, 4.0, 16.0], "step_ms": pytest.approx([300.0, 100.0, 200.0]),
                               "chosen_mb": 4.0, "done": True}


def test_one_candidate_is_decided_without_measuring() -> None:
    tuner = BucketAutotuner([1.0, 4.0])
    tuner.narrow([4.0])
    assert tuner.done and tuner.current_mb == 4.0
    measuring = BucketAutotuner([1.0, 2.0], settle_steps=0)
    measuring.record(0.1)
    with pytest.raises(RuntimeError, match="before the first record"):
        measuring.narrow([1.0])


def test_identical_plans_are_tried_once() -> None:
    plans = {1.0: [[2], [1, 0]], 4.0: [[2, 1, 0]], 25.0: [[2, 1, 0]], 100.0: [[2, 1, 0]]}
    assert distinct_candidates(plans) == [1.0, 4.0]


@pytest.mark.parametrize(("cap", "candidates", "steps", "match"), [
    ("fast", None, 3, "bucket_cap_mb='fast'"),
    ("auto", [], 3, "autotune_candidates_mb"),
    ("auto", [1.0, -2.0], 3, "autotune_candidates_mb"),
    ("auto", None, 0, "autotune_measure_steps=0"),
])
def test_bad_autotune_arguments_name_themselves(cap: Any, candidates: Any, steps: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        autotuner_for(cap, candidates, steps)


def test_strategy_accepts_auto_and_rejects_other_strings() -> None:
    assert DDPStrategy(bucket_cap_mb="auto").bucket_cap_mb == "auto"
    with pytest.raises(TypeError, match="bucket_cap_mb"):
        DDPStrategy(bucket_cap_mb="big")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the reducer, one process
def _stack(widths: tuple[int, ...] = (64, 64, 64, 64)) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
    return nn.Sequential(*layers)


def _auto(model: nn.Module, candidates_mb: list[float], measure_steps: int = 3,
          first_bucket_cap_mb: float = 1.0) -> tuple[GradReducer, CapTuning]:
    """A reducer with bucket_cap_mb="auto", as DDPStrategy builds it."""
    reducer = GradReducer(model, bucket_cap_mb=first_pass_cap_mb("auto"), first_bucket_cap_mb=first_bucket_cap_mb)
    tuning = CapTuning.attach(reducer, "auto", candidates_mb, measure_steps)
    assert tuning is not None
    return reducer, tuning


def _step(model: nn.Module, reducer: GradReducer, seed: int) -> None:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))
    loss = model(x).square().mean()
    reduced_backward(reducer, loss)


def test_reducer_tries_each_distinct_cap_then_keeps_the_agreed_one() -> None:
    model, reference = _stack(), _stack()
    reducer, tuning = _auto(model, [10 * KIB, 20 * KIB, 1.0, 50.0], measure_steps=1, first_bucket_cap_mb=1.0)
    caps, bucket_counts = [], []
    for seed in range(8):
        model.zero_grad(set_to_none=False)
        reference.zero_grad()
        _step(model, reducer, seed)
        reference(torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))).square().mean().backward()
        for ours, theirs in zip(model.parameters(), reference.parameters()):
            assert torch.equal(ours.grad, theirs.grad)  # switching plans never loses a gradient
        caps.append(reducer.bucket_cap_mb)
        bucket_counts.append(reducer.summary()["buckets"])
    autotune = reducer_summary(reducer, tuning)["autotune"]
    # 1.0 and 50.0 MiB give the same single bucket for 49 KiB of gradients: tried once.
    assert autotune["candidates_mb"] == [10 * KIB, 20 * KIB, 1.0] and autotune["done"]
    # Step 0 observes the readiness order; then each candidate gets a settle and a measured step.
    assert caps[:7] == [10 * KIB, 10 * KIB, 20 * KIB, 20 * KIB, 1.0, 1.0, autotune["chosen_mb"]]
    assert bucket_counts[:6] == [6, 6, 3, 3, 1, 1]
    assert caps[-1] == autotune["chosen_mb"] and len(autotune["step_ms"]) == 3


def test_adopted_cap_skips_measuring() -> None:
    model = _stack()
    reducer, tuning = _auto(model, [10 * KIB, 1.0])
    tuning.adopt(10 * KIB)
    for seed in range(3):
        _step(model, reducer, seed)
        assert reducer.bucket_cap_mb == 10 * KIB
    assert reducer_summary(reducer, tuning)["autotune"]["chosen_mb"] == 10 * KIB


def test_strategy_state_dict_carries_the_tuned_cap() -> None:
    strategy = DDPStrategy(bucket_cap_mb="auto")
    assert strategy.state_dict() == {"bucket_cap_mb": "auto", "tuned_bucket_cap_mb": None}
    strategy.load_state_dict({"bucket_cap_mb": "auto", "tuned_bucket_cap_mb": 4.0})
    assert strategy._tuned_bucket_cap_mb == 4.0  # adopted by setup_module's reducer
    fixed = DDPStrategy(bucket_cap_mb=8)
    fixed.load_state_dict({"tuned_bucket_cap_mb": 4.0})  # a number given by the user wins
    assert fixed._tuned_bucket_cap_mb is None and fixed.state_dict()["tuned_bucket_cap_mb"] is None


# ---------------------------------------------------------------------- two real ranks
def _tune_on_ranks(rank: int, world_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    reducer, tuning = _auto(model, [4 * KIB, 1.0], measure_steps=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(7):
        x, y = global_batch(step)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(shard(x, rank, world_size)), shard(y, rank, world_size))
        reducer.prepare_for_backward(loss)
        if rank == 1 and reducer.bucket_cap_mb == 1.0:
            time.sleep(0.05)  # only rank 1 finds the big bucket slow: the slowest rank decides
        loss.backward()
        reducer.finish_backward()
        optimizer.step()
    return {"summary": reducer_summary(reducer, tuning), "identical": identical_across_ranks(flat_params(model))}


@pytest.mark.timeout(120)
@pytest.mark.conformance
def test_ranks_agree_on_the_cap_the_slowest_rank_prefers() -> None:
    rank0, rank1 = run_on_ranks(_tune_on_ranks, 2)
    for result in (rank0, rank1):
        autotune = result["summary"]["autotune"]
        assert autotune["done"] and autotune["chosen_mb"] == 4 * KIB
        assert result["identical"]
    assert rank0["summary"]["autotune"]["step_ms"] == rank1["summary"]["autotune"]["step_ms"]
    assert rank0["summary"]["bucket_param_indices"] == rank1["summary"]["bucket_param_indices"]


def test_the_tuned_cap_travels_in_the_checkpoint_and_a_resume_adopts_it(tmp_path: Path) -> None:
    """`bucket_cap_mb="auto"` measures during the first steps; the pick is saved in every full
    checkpoint (loops.ddp_trainer.strategy) and a resumed fit adopts it instead of measuring again."""
    from tests.helpers.models import RegressionData, TinyRegressor
    from trainer import Trainer

    def fit(max_epochs: int, ckpt_path: str | None) -> tuple[DDPStrategy, Trainer]:
        strategy = DDPStrategy(bucket_cap_mb="auto", accelerator="cpu")
        trainer = Trainer(accelerator="cpu", devices=1, strategy=strategy, max_epochs=max_epochs, logger=False,
                          enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        trainer.fit(TinyRegressor(), datamodule=RegressionData(n=256, batch_size=8), ckpt_path=ckpt_path)
        return strategy, trainer

    first, trainer = fit(max_epochs=1, ckpt_path=None)
    path = trainer.checkpoint_callback.best_model_path
    tuned = torch.load(path, weights_only=True)["loops"]["ddp_trainer"]["strategy"]
    assert tuned["bucket_cap_mb"] == "auto" and tuned["tuned_bucket_cap_mb"] > 0
    resumed, _ = fit(max_epochs=2, ckpt_path=path)
    assert resumed._tuned_bucket_cap_mb == tuned["tuned_bucket_cap_mb"]
