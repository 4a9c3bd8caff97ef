"""TorchCheckpointIO: atomic writes and code-free reads."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO


class Payload:
    """A class weights_only loading must refuse to reconstruct."""

    def __init__(self) -> None:
        self.value = 1


def test_round_trip(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "nested" / "model.ckpt"
    io.save({"w": torch.arange(3.0), "step": 4, "meta": {"lr": [0.1]}}, path)
    loaded = io.load(path)
    assert torch.equal(loaded["w"], torch.arange(3.0)) and loaded["step"] == 4 and loaded["meta"] == {"lr": [0.1]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.ckpt"]  # no temp file left


def test_failing_save_keeps_the_old_file_and_leaves_no_temp_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "model.ckpt"
    io.save({"version": 1}, path)
    real_save = torch.save

    def half_then_fail(obj: Any, handle: Any, *args: Any, **kwargs: Any) -> None:
        real_save({"version": 2, "big": torch.zeros(1000)}, handle)
        handle.truncate(100)  # a partly written file ...
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # ... and then the disk is full

    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(CheckpointError, match=rf"Could not write checkpoint '{path}': No space left on device "
                                              r"\(errno 28\); the previous file is unchanged"):
        io.save({"version": 2}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert io.load(path) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]


def test_a_real_write_failure_midway_names_the_file_and_keeps_the_old_one(tmp_path: Path) -> None:
    """The operating system refuses the write part of the way in (a file-size limit below the new
    checkpoint's size: EFBIG, as ENOSPC would on a full disk): the error names the file and the
    cause, the earlier checkpoint still loads, and no temporary file is left."""
    path = tmp_path / "model.ckpt"
    TorchCheckpointIO().save({"w": torch.ones(10)}, path)
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        try:
            TorchCheckpointIO().save({{"w": torch.ones(100_000)}}, {str(path)!r})
        except CheckpointError as error:
            print(error)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).parents[3])
    assert f"Could not write checkpoint '{path}': File too large" in result.stdout, result.stdout + result.stderr
    assert "the previous file is unchanged" in result.stdout
    assert torch.equal(TorchCheckpointIO().load(path)["w"], torch.ones(10))
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]


def test_truncated_file_raises_checkpoint_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.ckpt"
    TorchCheckpointIO().save({"w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="model.ckpt"):
        TorchCheckpointIO().load(path)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nothing.ckpt"):
        TorchCheckpointIO().load(tmp_path / "nothing.ckpt")


def test_pickle_with_custom_class_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.ckpt"
    torch.save({"payload": Payload()}, path)
    with pytest.raises(CheckpointError, match="evil.ckpt") as info:
        TorchCheckpointIO().load(path)
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)


def test_non_dict_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.ckpt"
    torch.save([1, 2], path)
    with pytest.raises(CheckpointError, match="list"):
        TorchCheckpointIO().load(path)


def test_remove_is_idempotent(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "model.ckpt"
    io.save({}, path)
    io.remove(path)
    io.remove(path)
    assert not path.exists()


def test_a_temporary_file_left_by_a_killed_write_is_swept_by_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    (tmp_path / ".last.ckpt.abc123.tmp").write_bytes(b"x" * 1000)  # a writer SIGKILLed mid-write left it
    (tmp_path / ".other.ckpt.def456.tmp").write_bytes(b"y")  # another file's: not ours to remove
    TorchCheckpointIO().save({"step": 1}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.ckpt.def456.tmp", "last.ckpt"]


def test_a_file_that_cannot_even_be_created_is_named_with_its_own_advice(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file cannot be created (a read-only mount; out of inodes): the same one-line error."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr("strategies.checkpoint_io.tempfile.mkstemp", refuse)
    with pytest.raises(CheckpointError, match=r"'.*model.ckpt': Read-only file system \(errno 30\); no earlier "
                                              r"file existed. Make the directory writable"):
        TorchCheckpointIO().save({"step": 1}, tmp_path / "model.ckpt")


@pytest.mark.skipif(not hasattr(torch.serialization, "set_crc32_options"), reason="torch < 2.5 has no CRC32 switch")
def test_a_checkpoint_is_written_without_zip_checksums_and_loads_exactly(tmp_path: Path) -> None:
    """torch.load never reads the zip CRC32s, and computing them was most of a save's CPU: they are left empty,
    torch's own setting is restored after (the user's, when they turned it off themselves), also after a
    failed save."""
    state = {"weight": torch.randn(64, 8), "step": 3}
    path = tmp_path / "a.ckpt"
    TorchCheckpointIO().save(state, path)
    with zipfile.ZipFile(path) as archive:
        records = [info for info in archive.infolist() if "/data/" in info.filename]
    assert records and all(info.CRC == 0 for info in records)
    loaded = TorchCheckpointIO().load(path)
    assert torch.equal(loaded["weight"], state["weight"]) and loaded["step"] == 3
    assert torch.serialization.get_crc32_options() is True
    torch.serialization.set_crc32_options(False)
    try:
        TorchCheckpointIO().save(state, tmp_path / "b.ckpt")
        assert torch.serialization.get_crc32_options() is False
    finally:
        torch.serialization.set_crc32_options(True)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        TorchCheckpointIO().save({"bad": lambda: None}, tmp_path / "c.ckpt")
    assert torch.serialization.get_crc32_options() is True and not (tmp_path / "c.ckpt").exists()
