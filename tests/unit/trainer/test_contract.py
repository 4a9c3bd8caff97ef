"""The Trainer contract (trainer/contract.py) is what docs/trainer-contract.md documents, what the real
Trainer offers (mypy checks it too) and what the callback tests' FakeTrainer offers: the fake cannot
drift from the Trainer it stands in for."""

from __future__ import annotations

from pathlib import Path

from typing_extensions import get_protocol_members

from tests.helpers.fake_trainer import FakeTrainer
from trainer import Trainer
from trainer.contract import TrainerContract

CONTRACT = sorted(get_protocol_members(TrainerContract))
DOC = (Path(__file__).parents[3] / "docs" / "trainer-contract.md").read_text()


def test_the_fake_trainer_offers_the_whole_contract(tmp_path: Path) -> None:
    fake = FakeTrainer(tmp_path)
    assert [name for name in CONTRACT if not hasattr(fake, name)] == []


def test_the_trainer_offers_the_whole_contract(tmp_path: Path) -> None:
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=tmp_path)
    assert [name for name in CONTRACT if not hasattr(trainer, name)] == []


def test_the_document_names_every_member() -> None:
    assert [name for name in CONTRACT if name not in DOC] == []
