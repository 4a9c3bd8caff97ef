"""Every configure_optimizers return form of Lightning normalises to optimizers + schedulers."""

from __future__ import annotations

import pytest
import torch

from trainer.optimizers import LRSchedulerConfig, check_schedulers, init_optimizers


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


def test_plateau_without_monitor_is_refused_where_the_loop_steps_it() -> None:
    opt = _opt()
    optimizers, configs = init_optimizers({"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt)})
    with pytest.raises(KeyError, match="monitor"):
        check_schedulers(optimizers, configs, object(), automatic=True, custom_step=False)
    check_schedulers(optimizers, configs, object(), automatic=False, custom_step=False)  # the user steps it


def test_manual_optimization_warns_that_stepping_keys_are_ignored() -> None:
    opt = _opt()
    returned = {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1),
                                                    "interval": "step", "name": "lr"}}
    with pytest.warns(RuntimeWarning, match=r"\['interval'\]"):
        check_schedulers(*init_optimizers(returned), object(), automatic=False, custom_step=False)


def test_scheduler_of_an_optimizer_not_returned_is_refused() -> None:
    returned, other = _opt(), _opt()
    configs = init_optimizers(([returned], [torch.optim.lr_scheduler.StepLR(other, 1)]))[1]
    with pytest.raises(ValueError, match="not returned"):
        check_schedulers([returned], configs, object(), automatic=True, custom_step=False)


class _NotTorchScheduler:
    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_a_foreign_scheduler_needs_lr_scheduler_step_in_automatic_optimization() -> None:
    opt = _opt()
    configs = init_optimizers(([opt], [_NotTorchScheduler(opt)]))[1]
    with pytest.raises(TypeError, match="lr_scheduler_step"):
        check_schedulers([opt], configs, object(), automatic=True, custom_step=False)
    check_schedulers([opt], configs, object(), automatic=True, custom_step=True)
    check_schedulers([opt], configs, object(), automatic=False, custom_step=False)


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


def test_unknown_scheduler_keys_are_ignored_with_a_warning() -> None:
    opt = _opt()
    with pytest.warns(RuntimeWarning, match=r"\['foo'\]"):
        _, (config,) = init_optimizers({"optimizer": opt, "lr_scheduler": {
            "scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "foo": 1, "interval": "step"}})
    assert config.interval == "step"


def test_scheduler_configs_compare_equal_to_lightnings() -> None:
    types = pytest.importorskip("lightning.pytorch.utilities.types")
    opt = _opt()
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    ours = LRSchedulerConfig(plateau, monitor="val_loss")
    assert ours == types.LRSchedulerConfig(scheduler=plateau, monitor="val_loss", reduce_on_plateau=True)
    assert ours != types.LRSchedulerConfig(scheduler=plateau, monitor="other", reduce_on_plateau=True)
