"""The background checkpoint writer (strategies/async_checkpoint.py) and its snapshot, in one process."""

from __future__ import annotations

import errno
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import SingleDeviceStrategy
from strategies import checkpoint_io as checkpoint_io_module
from strategies.async_checkpoint import BackgroundCheckpointWriter
from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO
from strategies.checkpoint_snapshot import CheckpointSnapshot
from tests.helpers.checkpoint_writers import DiskFullMidway, GatedCheckpointIO, fingerprint


def _state(value: float) -> dict[str, Any]:
    return {"state_dict": {"w": torch.full((4, 3), value)}, "step": int(value), "extra": {"scores": [value]}}


def test_the_snapshot_shares_nothing_mutable_with_the_live_state() -> None:
    live = {"w": torch.ones(3), "opt": {"state": {0: {"exp_avg": torch.zeros(2), "step": torch.tensor(1.0)}}},
            "callbacks": {"scores": [1.0]}, "name": "x"}
    snapshot = CheckpointSnapshot()
    copied = snapshot.take(live)
    before = fingerprint(copied)
    live["w"].add_(1)
    live["opt"]["state"][0]["exp_avg"].add_(1)
    live["opt"]["state"][0]["step"].add_(1)
    live["callbacks"]["scores"].append(2.0)
    assert fingerprint(copied) == before
    assert copied["w"].data_ptr() != live["w"].data_ptr()


def test_the_snapshot_reuses_its_buffers_for_the_next_save() -> None:
    snapshot = CheckpointSnapshot()
    first = snapshot.take({"w": torch.ones(1000), "b": torch.ones(3)})
    pointer = first["w"].data_ptr()
    second = snapshot.take({"w": torch.full((1000,), 2.0), "b": torch.ones(5)})  # b changed shape: a new buffer
    assert second["w"].data_ptr() == pointer and torch.equal(second["w"], torch.full((1000,), 2.0))
    assert second["b"].shape == (5,)
    assert snapshot.nbytes == (1000 + 5) * 4


def test_the_snapshot_copies_tied_weights_once_and_every_tensor_kind(tmp_path: Path) -> None:
    """Tied weights (one tensor under two keys) stay one tensor, as torch.save keeps them, so the file is no
    larger than a synchronous save's; quantized and nested tensors, which have no plain buffer to copy into,
    are copied whole."""
    shared = torch.randn(64, 32)
    live = {"embedding.weight": shared, "head.weight": shared,
            "quantized": torch.quantize_per_tensor(torch.randn(8), 0.1, 0, torch.qint8),
            "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}
    copied = CheckpointSnapshot().take(live)
    assert copied["embedding.weight"] is copied["head.weight"]
    assert copied["embedding.weight"].data_ptr() != shared.data_ptr()
    assert torch.equal(copied["quantized"].dequantize(), live["quantized"].dequantize())
    assert copied["quantized"].data_ptr() != live["quantized"].data_ptr()
    TorchCheckpointIO().save(copied, tmp_path / "a.ckpt")
    loaded = TorchCheckpointIO().load(tmp_path / "a.ckpt")
    assert loaded["embedding.weight"] is loaded["head.weight"] and torch.equal(loaded["head.weight"], shared)
    assert [t.tolist() for t in loaded["nested"].unbind()] == [[1.0, 1.0], [1.0, 1.0, 1.0]]


def test_submit_returns_before_the_file_exists_and_wait_finishes_it(tmp_path: Path) -> None:
    io = GatedCheckpointIO()
    writer = BackgroundCheckpointWriter(io)
    target = tmp_path / "a.ckpt"
    live = _state(1.0)
    writer.submit(live, str(target))
    live["state_dict"]["w"].add_(5)  # the next optimizer step: the file must not see it
    assert not target.exists()
    io.gate.set()
    writer.wait()
    assert fingerprint(torch.load(target, weights_only=True)) == fingerprint(_state(1.0))
    assert writer.stats.saves == writer.stats.committed == 1


def test_a_second_save_waits_for_the_first_and_the_wait_is_counted(tmp_path: Path) -> None:
    io = GatedCheckpointIO()
    writer = BackgroundCheckpointWriter(io)
    writer.submit(_state(1.0), str(tmp_path / "a.ckpt"))
    threading.Timer(0.2, io.gate.set).start()
    writer.submit(_state(2.0), str(tmp_path / "b.ckpt"))  # blocks until the first is written
    assert (tmp_path / "a.ckpt").is_file()
    writer.wait()
    assert writer.stats.waits >= 1 and writer.stats.wait_s > 0
    assert writer.stats.last_stall_s >= writer.stats.wait_s / 2


def test_rotation_removes_the_old_file_only_after_the_new_one_is_committed(tmp_path: Path) -> None:
    strategy = SingleDeviceStrategy(accelerator="cpu", checkpoint_io=GatedCheckpointIO(), async_checkpoint=True)
    old, new = tmp_path / "step=1.ckpt", tmp_path / "step=2.ckpt"
    TorchCheckpointIO().save(_state(1.0), old)
    strategy.save_checkpoint(_state(2.0), new, background=True)
    strategy.remove_checkpoint(old)
    assert old.is_file() and not new.exists()  # a crash now would still find step 1
    strategy.checkpoint_io.gate.set()  # type: ignore[attr-defined]
    strategy.finish_checkpoints()
    assert new.is_file() and not old.exists()


def test_a_full_disk_midway_raises_on_the_training_side_naming_the_file_and_keeps_the_previous(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    strategy = SingleDeviceStrategy(accelerator="cpu", async_checkpoint=True)
    target = tmp_path / "last.ckpt"
    strategy.save_checkpoint(_state(1.0), target, background=True)
    strategy.finish_checkpoints()
    real_dump = checkpoint_io_module._dump
    monkeypatch.setattr(checkpoint_io_module, "_dump", lambda checkpoint, handle: real_dump(
        checkpoint, DiskFullMidway(handle, budget=300)))
    strategy.save_checkpoint(_state(2.0), target, background=True)
    strategy.remove_checkpoint(tmp_path / "other.ckpt")  # waits for the failed write: never runs
    with pytest.raises(CheckpointError, match=r"last\.ckpt.*No space left on device.*previous file is unchanged"):
        for _ in range(1000):  # the next steps: the error surfaces at the first one after the write failed
            strategy.raise_failed_checkpoint_write()
            strategy._checkpoint_writer._write.thread.join(0.01)  # type: ignore[union-attr]
    assert fingerprint(torch.load(target, weights_only=True)) == fingerprint(_state(1.0))
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]  # no temporary file left
    strategy.raise_failed_checkpoint_write()  # raised once, not again
    monkeypatch.setattr(checkpoint_io_module, "_dump", real_dump)
    strategy.save_checkpoint(_state(3.0), target, background=True)  # the next save works again
    strategy.teardown()
    assert fingerprint(torch.load(target, weights_only=True)) == fingerprint(_state(3.0))


def test_teardown_raises_a_pending_failure_unless_the_stage_already_fails(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(checkpoint: Any, handle: Any) -> None:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(checkpoint_io_module, "_dump", refuse)
    strategy = SingleDeviceStrategy(accelerator="cpu")
    strategy.save_checkpoint(_state(1.0), tmp_path / "a.ckpt", background=True)
    with pytest.raises(CheckpointError, match=r"a\.ckpt.*Permission denied"):
        strategy.teardown()
    strategy.save_checkpoint(_state(1.0), tmp_path / "b.ckpt", background=True)
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        strategy.teardown()  # logs the write's error instead of replacing the Ctrl-C


def test_a_synchronous_save_first_finishes_the_background_one(tmp_path: Path) -> None:
    io = GatedCheckpointIO()
    strategy = SingleDeviceStrategy(accelerator="cpu", checkpoint_io=io)
    strategy.save_checkpoint(_state(1.0), tmp_path / "a.ckpt", background=True)
    threading.Timer(0.1, io.gate.set).start()
    strategy.save_checkpoint(_state(2.0), tmp_path / "b.ckpt")
    assert (tmp_path / "a.ckpt").is_file() and (tmp_path / "b.ckpt").is_file()
    assert strategy.checkpoint_stats.waits == 1


def test_a_strategy_with_a_writer_still_pickles_and_the_switch_is_checked() -> None:
    strategy = SingleDeviceStrategy(accelerator="cpu", async_checkpoint=True)
    strategy._background_writer()
    copy = pickle.loads(pickle.dumps(strategy))
    assert copy.async_checkpoint is True and copy._checkpoint_writer is None
    with pytest.raises(TypeError, match="async_checkpoint must be True or False"):
        SingleDeviceStrategy(async_checkpoint="yes")  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_snapshot_is_pinned_and_ordered_before_the_next_step() -> None:
    weight = torch.randn(1 << 20, device="cuda")
    expected = weight.cpu()
    snapshot = CheckpointSnapshot()
    copied = snapshot.take({"w": weight})
    weight.add_(1)  # queued after the non-blocking copy on the same stream: the copy still reads the old values
    snapshot.ready()
    assert copied["w"].is_pinned() and torch.equal(copied["w"], expected)
