"""TextDataModule: one UTF-8 text file, a character vocabulary and (block_size + 1)-character windows.

Training draws every window start in shuffled order (so an epoch sees each offset once and
DistributedSampler shards them across ranks); validation uses non-overlapping windows from
the last `val_fraction` of the file, so the two never share text.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from trainer.datamodule import LightningDataModule
from trainer.demos.common import check_fraction, check_positive, make_loader

DEFAULT_TEXT = "lighthouse.txt"  # original prose shipped in trainer/demos/data/


def default_text_path() -> Path:
    return Path(str(resources.files("trainer.demos") / "data" / DEFAULT_TEXT))


class TextWindows(Dataset):
    """Item i is (chars[s : s + T], chars[s + 1 : s + T + 1]) for the i-th start s."""

    def __init__(self, data: torch.Tensor, block_size: int, stride: int) -> None:
        self.data, self.block_size = data, block_size
        self.starts = range(0, len(data) - block_size, stride)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.starts[index]
        chunk = self.data[start:start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class TextDataModule(LightningDataModule):
    """Character-level language-modelling data from `path` (default: a small bundled text).

    `vocab_size` reads the file on first use, so the CLI can size the model before training.
    """

    def __init__(self, path: str | None = None, block_size: int = 64, batch_size: int = 32,
                 val_fraction: float = 0.1, num_workers: int = 0) -> None:
        super().__init__()
        check_positive("block_size", block_size)
        check_positive("batch_size", batch_size)
        check_positive("num_workers", num_workers, allow_zero=True)
        check_fraction("val_fraction", val_fraction)
        self.path = Path(path).expanduser() if path else default_text_path()
        self.block_size, self.batch_size = block_size, batch_size
        self.val_fraction, self.num_workers = val_fraction, num_workers
        self._text: str | None = None
        self.train_set: TextWindows | None = None
        self.val_set: TextWindows | None = None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = read_text(self.path, self.block_size, self.val_fraction)
        return self._text

    @property
    def chars(self) -> list[str]:
        return sorted(set(self.text))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        index = {ch: i for i, ch in enumerate(self.chars)}
        unknown = sorted(set(text) - set(index))
        if unknown:
            raise ValueError(f"characters {unknown} are not in the vocabulary of {self.path}")
        return torch.tensor([index[ch] for ch in text], dtype=torch.long)

    def decode(self, tokens: torch.Tensor | list[int]) -> str:
        chars = self.chars
        return "".join(chars[int(i)] for i in tokens)

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        data = self.encode(self.text)
        n_val = int(len(data) * self.val_fraction)
        self.train_set = TextWindows(data[:-n_val], self.block_size, stride=1)
        self.val_set = TextWindows(data[-n_val:], self.block_size, stride=self.block_size)

    def train_dataloader(self) -> DataLoader:
        return make_loader(self, self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self, self.val_set, shuffle=False)


def read_text(path: Path, block_size: int, val_fraction: float) -> str:
    """The file's text, or an error naming the path and what a usable file needs."""
    if not path.is_file():
        raise FileNotFoundError(f"text file {str(path)!r} does not exist (data.path)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"text file {str(path)!r} is not valid UTF-8: {error}") from None
    if not text:
        raise ValueError(f"text file {str(path)!r} is empty")
    # Both splits need at least one full window plus its shifted target.
    needed = int((block_size + 1) / min(val_fraction, 1 - val_fraction)) + 2
    if len(text) < needed:
        raise ValueError(f"text file {str(path)!r} has {len(text)} characters; block_size={block_size} with "
                         f"val_fraction={val_fraction} needs at least {needed}")
    return text
