"""Every configure_optimizers return form of Lightning normalises to optimizers + schedulers."""

from __future__ import annotations

import pytest
import torch

from trainer.optimizers import LRSchedulerConfig, init_optimizers


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)


def test_single_optimizer() -> None:
    opt = _opt()
    assert init_optimizers(opt) == ([opt], [])


def test_list_of_optimizers() -> None:
    a, b = _opt(), _opt()
    assert init_optimizers([a, b]) == ([a, b], [])


def test_two_lists() -> None:
    opt = _opt()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    optimizers, configs = init_optimizers(([opt], [sched]))
    assert optimizers == [opt] and configs[0].scheduler is sched and configs[0].interval == "epoch"


def test_dict_with_scheduler_dict() -> None:
    opt = _opt()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    _, configs = init_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step",
                                                                     "frequency": 2, "name": "lr"}})
    assert configs == [LRSchedulerConfig(sched, "step", 2, None, "lr", True)]


def test_plateau_takes_monitor_from_outer_dict() -> None:
    opt = _opt()
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    _, configs = init_optimizers({"optimizer": opt, "lr_scheduler": plateau, "monitor": "val_loss"})
    assert configs[0].monitor == "val_loss" and configs[0].reduce_on_plateau


def test_plateau_without_monitor_is_refused() -> None:
    opt = _opt()
    with pytest.raises(KeyError, match="monitor"):
        init_optimizers({"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt)})


def test_list_of_dicts_and_none() -> None:
    a, b = _opt(), _opt()
    assert init_optimizers([{"optimizer": a}, {"optimizer": b}])[0] == [a, b]
    assert init_optimizers(None) == ([], [])


@pytest.mark.parametrize("bad", [42, "adam", [1, 2], {"lr": 1}])
def test_bad_returns_name_the_problem(bad: object) -> None:
    with pytest.raises((TypeError, KeyError), match="configure_optimizers|optimizer"):
        init_optimizers(bad)


def test_bad_interval() -> None:
    opt = _opt()
    with pytest.raises(ValueError, match="interval"):
        init_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1),
                                                            "interval": "batch"}})
