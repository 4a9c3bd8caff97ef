"""A mid-epoch checkpoint resumed on another number of processes continues the epoch's global
sample order: every sample of the epoch is trained on exactly once (plus the sampler's padding)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from strategies.sampler import ResumableDistributedSampler
from tests.helpers.models import IndexData, SampleRecorder
from trainer import Trainer
from trainer.callbacks import ModelCheckpoint

pytestmark = pytest.mark.timeout(240)
N, BATCH = 40, 4


@pytest.fixture(autouse=True)
def _sampler_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler's shuffle seed comes from PL_GLOBAL_SEED, which other tests' seed_everything set."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")


def _fit(tmp_path: Path, devices: int, tag: str, ckpt_path: str | None = None, **kwargs: Any) -> None:
    trainer = Trainer(accelerator="cpu", devices=devices, strategy="ddp", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, **kwargs)
    trainer.fit(SampleRecorder(str(tmp_path), tag), datamodule=IndexData(N, BATCH), ckpt_path=ckpt_path)


def _seen(tmp_path: Path, tag: str, ranks: int) -> dict[int, list[list[int]]]:
    """batch_idx -> the indices each rank trained on in epoch 0 (rank order)."""
    by_batch: dict[int, list[list[int]]] = {}
    for rank in range(ranks):
        for epoch, batch_idx, indices in json.loads((tmp_path / f"{tag}_rank{rank}.json").read_text()):
            if epoch == 0:
                by_batch.setdefault(batch_idx, []).append(indices)
    return by_batch


def _epoch_order() -> list[int]:
    return list(ResumableDistributedSampler(range(N), num_replicas=1, rank=0, shuffle=True, seed=0))


def _interrupted_run(tmp_path: Path) -> Path:
    """2 processes, stopped after 3 steps (24 of 40 samples) with a checkpoint there."""
    _fit(tmp_path, 2, "first", max_steps=3,
         callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)])
    (checkpoint,) = (tmp_path / "ckpt").glob("*.ckpt")
    return checkpoint


def test_two_processes_resumed_on_one_continue_the_sample_stream(tmp_path: Path) -> None:
    checkpoint = _interrupted_run(tmp_path)
    first = [i for ranks in _seen(tmp_path, "first", 2).values() for indices in ranks for i in indices]
    assert sorted(first) == sorted(_epoch_order()[:24])  # 3 steps x 4 per rank x 2 ranks
    _fit(tmp_path, 1, "resumed", ckpt_path=str(checkpoint), max_epochs=1)
    resumed = _seen(tmp_path, "resumed", 1)
    assert sorted(resumed) == [6, 7, 8, 9]  # numbering continues to the end of the 1-process epoch
    rest = [i for batch_idx in sorted(resumed) for i in resumed[batch_idx][0]]
    assert rest == _epoch_order()[24:]  # the same stream, in order: no sample repeated or skipped
    assert sorted(first + rest) == list(range(N))


@pytest.mark.conformance
def test_two_processes_resumed_on_three_pad_only_the_rest(tmp_path: Path) -> None:
    checkpoint = _interrupted_run(tmp_path)
    _fit(tmp_path, 3, "resumed3", ckpt_path=str(checkpoint), max_epochs=1)
    resumed = _seen(tmp_path, "resumed3", 3)
    rest = [i for batch_idx in sorted(resumed) for indices in resumed[batch_idx] for i in indices]
    order = _epoch_order()
    # 16 samples left over 3 ranks: 18 with 2 padded from the epoch's start, as DistributedSampler pads.
    assert sorted(rest) == sorted(order[24:] + order[:2])
