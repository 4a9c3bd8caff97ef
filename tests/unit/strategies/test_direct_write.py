"""Large checkpoints written around the page cache (O_DIRECT): the same file content torch.load reads,
snapshot buffers written without a copy, an ordinary write where the file system refuses, and a failure
midway that names the file and keeps the previous one."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import checkpoint_io, direct_write
from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO
from strategies.checkpoint_snapshot import CheckpointSnapshot
from strategies.direct_write import ALIGNMENT, DirectFile, set_direct_writes
from tests.helpers.checkpoint_writers import direct_writes_work_in, record_direct_writes

MIB = 1024 * 1024


@pytest.fixture
def direct_dir(tmp_path: Path) -> Path:
    if not direct_writes_work_in(tmp_path):
        pytest.skip("this torch or the file system under the test's directory has no direct writes")
    return tmp_path


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[DirectFile]:
    """Every DirectFile a save finished, so a test can see that the direct path ran and what it copied."""
    return record_direct_writes(monkeypatch)


def _mixed_checkpoint() -> dict[str, Any]:
    """Mostly page-aligned tensors (a snapshot's buffers, as a background save writes) beside tensors of every
    awkward kind, written from wherever they live: sizes that are no multiple of a block, a dtype of 2 bytes,
    an empty tensor, a non-contiguous view, two tensors sharing one storage, and plain values."""
    torch.manual_seed(0)
    aligned = CheckpointSnapshot().take({"big": torch.randn(9 * MIB // 4 + 3),
                                         "ints": torch.arange(2 * MIB + 5, dtype=torch.int64)})
    shared = torch.randn(1000, 37)
    return {
        **aligned,
        "half": torch.randn(3 * MIB + 1).to(torch.bfloat16),
        "empty": torch.empty(0),
        "strided": torch.randn(500, 3001)[:, ::2],
        "shared_a": shared, "shared_b": shared[10:20],
        "meta": {"step": 7, "lr": [0.1, 0.01], "name": "x"},
    }


def _assert_same(loaded: dict[str, Any], expected: dict[str, Any]) -> None:
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
        else:
            assert loaded[key] == value, key
    assert loaded["shared_b"].untyped_storage().data_ptr() == loaded["shared_a"].untyped_storage().data_ptr()


def test_a_large_checkpoint_is_written_direct_and_loads_the_same(direct_dir: Path, written: list[DirectFile],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_io, "DIRECT_WRITE_MIN_BYTES", 16 * MIB)
    checkpoint = _mixed_checkpoint()
    path = direct_dir / "model.ckpt"
    TorchCheckpointIO().save(checkpoint, path)
    assert len(written) == 1
    _assert_same(torch.load(path, weights_only=True), checkpoint)
    assert sorted(p.name for p in direct_dir.iterdir()) == ["model.ckpt"]


def test_the_snapshots_buffers_reach_the_disk_without_a_copy(direct_dir: Path, written: list[DirectFile]) -> None:
    """What a background save writes (the snapshot, page-aligned) goes to the disk in place: only headers,
    the pickle and each storage's last partial block pass through the bounce buffer."""
    weights = [torch.randn(5 * MIB + 123) for _ in range(4)]
    live = {"weights": weights, "step": 3}
    snapshot = CheckpointSnapshot().take(live)
    tensor_bytes = sum(t.untyped_storage().nbytes() for t in snapshot["weights"])
    assert tensor_bytes >= checkpoint_io.DIRECT_WRITE_MIN_BYTES
    assert all(t.untyped_storage().data_ptr() % ALIGNMENT == 0 for t in snapshot["weights"])
    path = direct_dir / "snapshot.ckpt"
    TorchCheckpointIO().save(snapshot, path)
    [direct] = written
    assert direct.bytes_copied < 64 * 1024, direct.bytes_copied
    loaded = torch.load(path, weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(loaded["weights"], weights)) and loaded["step"] == 3


def test_small_live_or_fragmented_checkpoints_go_through_the_page_cache(tmp_path: Path,
                                                                       written: list[DirectFile]) -> None:
    """Direct writes pay off only for large checkpoints in page-aligned memory: live tensors (a synchronous
    save) would be copied all the same; aligning every storage to a block pads the file by up to a block per
    tensor, too much for many small tensors (the file would grow by more than ~2 %)."""
    io = TorchCheckpointIO()
    io.save({"w": torch.randn(1000)}, tmp_path / "small.ckpt")
    many = CheckpointSnapshot().take({f"t{i}": torch.randn(16 * 1024) for i in range(600)})  # 64 KiB each
    io.save(many, tmp_path / "many.ckpt")
    io.save({"live": [torch.randn(5 * MIB + 1) for _ in range(4)]}, tmp_path / "live.ckpt")
    assert written == []
    assert torch.equal(io.load(tmp_path / "many.ckpt")["t599"], many["t599"])


def test_a_file_system_that_refuses_direct_writes_gets_an_ordinary_one(direct_dir: Path, written: list[DirectFile],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_io, "DIRECT_WRITE_MIN_BYTES", 16 * MIB)
    real_write, calls = os.write, []

    def refusing_after_the_first(fd: int, data: Any) -> int:
        calls.append(len(data))
        if len(calls) > 1:  # the flag was taken, then a write refused midway
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_write(fd, data)

    monkeypatch.setattr(direct_write.os, "write", refusing_after_the_first)
    checkpoint = _mixed_checkpoint()
    path = direct_dir / "model.ckpt"
    TorchCheckpointIO().save(checkpoint, path)
    assert len(calls) == 2 and written == []
    _assert_same(torch.load(path, weights_only=True), checkpoint)
    assert sorted(p.name for p in direct_dir.iterdir()) == ["model.ckpt"]


def test_rewinding_a_direct_file_to_its_start_rewrites_it(direct_dir: Path) -> None:
    """The cloudpickle retry (a class from the user's script) rewinds the file it writes to its start."""
    path = direct_dir / "rewound.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    assert set_direct_writes(fd, True)
    direct = DirectFile(fd)
    try:
        direct.write(b"x" * (3 * ALIGNMENT + 5))
        direct.seek(0)
        direct.truncate()
        direct.write(b"abc")
        direct.write(bytes(range(256)) * 40)
        direct.finish()
        with pytest.raises(OSError, match="only be rewound to its start"):
            direct.seek(5)
    finally:
        direct.close()
        os.close(fd)
    assert path.read_bytes() == b"abc" + bytes(range(256)) * 40


def test_a_full_disk_midway_through_a_direct_write_names_the_file_and_keeps_the_previous(direct_dir: Path) -> None:
    """The operating system refuses the write part of the way in (a file-size limit: EFBIG, as ENOSPC
    would on a full disk): the error names the file and the cause, not a refused direct write, and the
    previous checkpoint still loads; no temporary file is left."""
    path = direct_dir / "model.ckpt"
    TorchCheckpointIO().save({"w": torch.ones(10)}, path)
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from strategies import checkpoint_io, direct_write
        from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO
        from strategies.checkpoint_snapshot import CheckpointSnapshot
        checkpoint_io.DIRECT_WRITE_MIN_BYTES = 1024 * 1024
        opened, real_init = [], direct_write.DirectFile.__init__
        def counting_init(self, fd):
            opened.append(fd)
            real_init(self, fd)
        direct_write.DirectFile.__init__ = counting_init
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 1024 * 1024, 8 * 1024 * 1024))
        try:
            TorchCheckpointIO().save(CheckpointSnapshot().take({{"w": torch.ones(4 * 1024 * 1024)}}), {str(path)!r})
        except CheckpointError as error:
            print(error)
        print("direct writes:", len(opened))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).parents[3])
    assert f"Could not write checkpoint '{path}': File too large" in result.stdout, result.stdout + result.stderr
    assert "the previous file is unchanged" in result.stdout and "direct writes: 1" in result.stdout
    assert torch.equal(TorchCheckpointIO().load(path)["w"], torch.ones(10))
    assert [p.name for p in direct_dir.iterdir()] == ["model.ckpt"]


@pytest.mark.parametrize("background", [False, True], ids=["synchronous", "snapshot"])
def test_tensors_without_one_storage_are_saved_as_before(tmp_path: Path, background: bool) -> None:
    """Sparse tensors have no single storage to ask for its address (`untyped_storage()` raises): choosing
    how to write the file must not fail a save that torch.save itself can write, synchronous or background,
    small or large."""
    sparse, csr = torch.eye(4).to_sparse(), torch.eye(4).to_sparse_csr()
    small: dict[str, Any] = {"sparse": sparse, "csr": csr, "step": 1}
    large: dict[str, Any] = {**small, "weights": [torch.randn(5 * MIB + 3) for _ in range(4)]}
    io = TorchCheckpointIO()
    for name, checkpoint in (("small.ckpt", small), ("large.ckpt", large)):
        saved = CheckpointSnapshot().take(checkpoint) if background else checkpoint
        io.save(saved, tmp_path / name)
        loaded = io.load(tmp_path / name)
        assert torch.equal(loaded["sparse"].to_dense(), torch.eye(4)), name
        assert torch.equal(loaded["csr"].to_dense(), torch.eye(4)), name
    assert all(torch.equal(a, b) for a, b in zip(io.load(tmp_path / "large.ckpt")["weights"], large["weights"]))



def _switches_held_on_another_thread() -> tuple[threading.Event, threading.Thread]:
    """Another thread's save holding torch.save's switches (as a background write does) until the event is set."""
    from strategies.torch_save_settings import storages_block_aligned, without_zip_crc32

    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with without_zip_crc32(), storages_block_aligned():
            entered.set()
            leave.wait(timeout=30)

    thread = threading.Thread(target=other)
    thread.start()
    assert entered.wait(timeout=30)
    return leave, thread


def test_saves_overlapping_on_two_threads_each_get_the_switches_and_leave_none_behind(
        direct_dir: Path, written: list[DirectFile]) -> None:
    """torch keeps its save switches per thread in recent versions (a ContextVar per setting): a save that
    starts while another thread's save holds them must still set them for itself (else its storages are
    not block-aligned and the whole file goes through the bounce buffer, CRC32s computed), and a thread
    finds its own settings again once its save is over, whichever thread's save ends last."""
    from torch.utils.serialization import config

    from strategies.torch_save_settings import storages_block_aligned, without_zip_crc32

    snapshot = CheckpointSnapshot().take({"weights": [torch.randn(5 * MIB + 123) for _ in range(4)]})
    path = direct_dir / "overlapping.ckpt"
    leave, other = _switches_held_on_another_thread()
    try:
        TorchCheckpointIO().save(snapshot, path)
    finally:
        leave.set()
        other.join(timeout=30)
    [direct] = written
    assert direct.bytes_copied < 64 * 1024, direct.bytes_copied
    with zipfile.ZipFile(path) as archive:
        assert all(info.CRC == 0 for info in archive.infolist() if "/data/" in info.filename)

    def settings() -> tuple[bool, int]:
        return torch.serialization.get_crc32_options(), config.save.storage_alignment

    found = settings()
    with without_zip_crc32(), storages_block_aligned():  # this thread's save starts first and ends first
        leave, other = _switches_held_on_another_thread()
    assert settings() == found
    leave.set()
    other.join(timeout=30)
    assert settings() == found
    leave, other = _switches_held_on_another_thread()  # the other starts first and ends first
    with without_zip_crc32(), storages_block_aligned():
        leave.set()
        other.join(timeout=30)
        assert settings() == (False, ALIGNMENT)
    assert settings() == found


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_snapshots_pinned_buffers_reach_the_disk_without_a_copy(direct_dir: Path,
                                                                            written: list[DirectFile]) -> None:
    """Pinned host memory comes page-aligned from the CUDA driver: a background save from a GPU writes in place
    as well (were it not aligned, the save would go through the page cache, never fail)."""
    weights = [torch.randn(5 * MIB + 123, device="cuda") for _ in range(4)]
    snapshot = CheckpointSnapshot()
    copied = snapshot.take({"weights": weights})
    snapshot.ready()
    assert all(t.is_pinned() and t.untyped_storage().data_ptr() % ALIGNMENT == 0 for t in copied["weights"])
    TorchCheckpointIO().save(copied, direct_dir / "gpu.ckpt")
    [direct] = written
    assert direct.bytes_copied < 64 * 1024, direct.bytes_copied
    loaded = torch.load(direct_dir / "gpu.ckpt", weights_only=True)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(loaded["weights"], weights))
