"""The demo datamodules and modules: shapes, splits, determinism, errors, and that they learn."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.demos.char_gpt import CharGPT
from trainer.demos.common import configure_optimizer
from trainer.demos.digits import DigitsClassifier, DigitsDataModule
from trainer.demos.synthetic import MLPRegressor, SyntheticDataModule
from trainer.demos.text import TextDataModule, default_text_path


# ---------------------------------------------------------------------- digits
@pytest.fixture(scope="module")
def digits() -> DigitsDataModule:
    datamodule = DigitsDataModule(batch_size=32)
    datamodule.setup("fit")
    return datamodule


def test_digits_split_shapes_and_standardisation(digits: DigitsDataModule) -> None:
    train_x, train_y = digits.train_set.tensors
    val_x, val_y = digits.val_set.tensors
    assert (len(train_y), len(val_y)) == (1438, 359)  # 1,797 images, round(20%) held out
    assert train_x.dtype == torch.float32 and train_x.shape[1] == 64 and train_y.dtype == torch.long
    assert set(train_y.unique().tolist()) == set(range(10))
    assert train_x.mean(dim=0).abs().max() < 1e-4  # standardised with the training statistics
    assert val_x.abs().max() < 20  # no feature blown up by a near-zero std
    x, y = next(iter(digits.train_dataloader()))
    assert x.shape == (32, 64) and y.shape == (32,)


def test_digits_split_is_fixed_by_its_seed(digits: DigitsDataModule) -> None:
    torch.manual_seed(123)  # the global RNG must not matter
    again = DigitsDataModule(seed=0)
    again.setup("fit")
    other = DigitsDataModule(seed=1)
    other.setup("fit")
    assert torch.equal(again.val_set.tensors[0], digits.val_set.tensors[0])
    assert not torch.equal(other.val_set.tensors[1], digits.val_set.tensors[1])


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"val_fraction": 1.0}, {"val_fraction": 0}])
def test_digits_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        DigitsDataModule(**kwargs)


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_digits_classifier_shapes_and_hparams(arch: str) -> None:
    model = DigitsClassifier(arch=arch, hidden_sizes=[32], channels=[4])
    assert model(torch.randn(5, 64)).shape == (5, 10)
    assert model.hparams.arch == arch and model.hparams.hidden_sizes == [32]


def test_digits_classifier_rejects_bad_choices() -> None:
    with pytest.raises(ValueError, match="arch='rnn'"):
        DigitsClassifier(arch="rnn")
    with pytest.raises(ValueError, match="input_dim=60 is not a perfect square"):
        DigitsClassifier(arch="cnn", input_dim=60)


@pytest.mark.conformance
def test_digits_mlp_learns(digits: DigitsDataModule) -> None:
    torch.manual_seed(0)
    model = DigitsClassifier()
    optimizer = model.configure_optimizers()
    for _ in range(3):
        for batch in digits.train_dataloader():
            optimizer.zero_grad()
            model.training_step(batch, 0).backward()
            optimizer.step()
    x, y = digits.val_set.tensors
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    assert accuracy > 0.9


# ---------------------------------------------------------------------- synthetic
def test_synthetic_classification_is_deterministic() -> None:
    first = SyntheticDataModule(num_samples=200, input_dim=8, num_classes=3, seed=5)
    first.setup("fit")
    second = SyntheticDataModule(num_samples=200, input_dim=8, num_classes=3, seed=5)
    second.setup("fit")
    x, y = first.train_set.tensors
    assert x.shape == (160, 8) and y.dtype == torch.long and int(y.max()) < 3
    assert len(first.val_set) == 40
    assert torch.equal(x, second.train_set.tensors[0]) and torch.equal(y, second.train_set.tensors[1])
    model = DigitsClassifier(input_dim=first.input_dim, num_classes=first.num_classes, hidden_sizes=[16])
    assert model(x).shape == (160, 3)


def test_synthetic_regression_feeds_the_regressor() -> None:
    data = SyntheticDataModule(task="regression", num_samples=100, input_dim=4, num_targets=2)
    data.setup("fit")
    x, y = next(iter(data.train_dataloader()))
    assert data.num_classes is None and y.dtype == torch.float32 and y.shape[1] == 2
    model = MLPRegressor(input_dim=4, num_targets=2, hidden_sizes=[8])
    assert model.training_step((x, y), 0).ndim == 0


def test_synthetic_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="task='ranking'"):
        SyntheticDataModule(task="ranking")
    with pytest.raises(ValueError, match="num_samples=2"):
        SyntheticDataModule(num_samples=2, val_fraction=0.1)


# ---------------------------------------------------------------------- text
def test_text_default_file_windows_and_vocab() -> None:
    data = TextDataModule(block_size=16, batch_size=4)
    data.setup("fit")
    assert data.path == default_text_path() and data.path.is_file()
    assert data.vocab_size == len(set(data.path.read_text(encoding="utf-8")))
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    first_x, first_y = data.train_set[0]
    assert torch.equal(first_x[1:], first_y[:-1])  # targets are the inputs shifted by one
    assert data.decode(data.encode("the keeper")) == "the keeper"
    train_chars, val_chars = len(data.train_set.data), len(data.val_set.data)
    assert train_chars + val_chars == len(data.text) and val_chars == int(len(data.text) * 0.1)


def test_text_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        TextDataModule(path=str(missing)).setup("fit")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.txt.*is empty"):
        _ = TextDataModule(path=str(empty)).vocab_size
    short = tmp_path / "short.txt"
    short.write_text("abc" * 50, encoding="utf-8")
    with pytest.raises(ValueError, match=r"short.txt.*150 characters; block_size=64"):
        TextDataModule(path=str(short), block_size=64).setup("fit")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe" * 1000)
    with pytest.raises(ValueError, match="not valid UTF-8"):
        TextDataModule(path=str(binary)).setup("fit")


# ---------------------------------------------------------------------- char GPT
def test_char_gpt_shapes_tying_and_generation() -> None:
    model = CharGPT(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)
    assert model(torch.randint(0, 11, (3, 8))).shape == (3, 8, 11)
    assert model.head.weight is model.token_emb.weight
    out = model.generate(torch.zeros(2, 1, dtype=torch.long), max_new_tokens=10,
                         generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 11) and int(out.max()) < 11
    with pytest.raises(ValueError, match="exceeds block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="n_embd=10 must be divisible by n_head=4"):
        CharGPT(n_embd=10, n_head=4)


def test_char_gpt_loss_decreases_on_real_text() -> None:
    torch.manual_seed(0)
    data = TextDataModule(block_size=16, batch_size=16)
    data.setup("fit")
    model = CharGPT(vocab_size=data.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=32)
    optimizer = model.configure_optimizers()
    batch = next(iter(data.train_dataloader()))
    initial = model.loss(batch).item()
    for _ in range(15):
        optimizer.zero_grad()
        model.training_step(batch, 0).backward()
        optimizer.step()
    assert initial == pytest.approx(torch.log(torch.tensor(float(data.vocab_size))).item(), rel=0.1)
    assert model.loss(batch).item() < 0.8 * initial


# ---------------------------------------------------------------------- optimizers
def test_configure_optimizer_choices() -> None:
    net = torch.nn.Linear(2, 2)
    assert isinstance(configure_optimizer(net, "sgd", 0.1), torch.optim.SGD)
    config = configure_optimizer(net, "adamw", 0.1, scheduler="cosine")
    assert isinstance(config["optimizer"], torch.optim.AdamW)
    assert config["lr_scheduler"]["scheduler"].T_max == 100  # no trainer attached: the fallback
    with pytest.raises(ValueError, match="optimizer='lion'"):
        configure_optimizer(net, "lion", 0.1)
    with pytest.raises(ValueError, match="scheduler='linear'"):
        configure_optimizer(net, "adam", 0.1, scheduler="linear")
