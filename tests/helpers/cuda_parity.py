"""Our Trainer + DDPStrategy on one GPU (nccl, world size 1) against a hand-written
`torch.nn.parallel.DistributedDataParallel` loop on the same GPU, same data, same precision.

Run by tests/distributed/test_cuda.py as `python -m tests.helpers.cuda_parity PRECISION OUT.json`,
in a process of its own, so NCCL and the CUDA context stay out of the rest of the suite. A third
argument `cpu` runs the same comparison on the CPU over gloo (to check this script without a GPU).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy
from tests.helpers.models import ddp_training_order, regression_data
from tests.helpers.spawn import free_port
from trainer import LightningModule, Trainer
from trainer.callbacks import Callback

STEPS, BATCH, FEATURES, SEED = 12, 32, 16, 7


def _net() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                         nn.Linear(64, 1))


def _optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2)


def _loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(net(x).float(), y)


def _loader(in_ddp_order: bool = False) -> DataLoader:
    """`in_ddp_order`: the order our Trainer's (shuffled) training sampler takes, for the hand-written loop."""
    x, y = regression_data(STEPS * BATCH, FEATURES, seed=0).tensors
    data = TensorDataset(x, y / y.std())  # unit-scale targets: a few steps learn
    return DataLoader(data, batch_size=BATCH, sampler=ddp_training_order(data) if in_ddp_order else None)


class ParityModule(LightningModule):
    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.net = _net()
        self.device_type = device_type
        self.autocast_seen: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.autocast_seen.append(torch.is_autocast_enabled(self.device_type))  # bf16-mixed really is on
        loss = _loss(self.net, *batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", _loss(self.net, *batch), sync_dist=True)  # epoch values reduced on the GPU's rank

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return _optimizer(self.parameters())


class Record(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.seen: dict[str, Any] = {}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.seen = {"backend": dist.get_backend(), "world_size": dist.get_world_size(),
                     "param_device": str(next(pl_module.parameters()).device)}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"].detach()))  # Lightning hands the step output as a dict


def ours(precision: str, root: str, device_type: str) -> dict[str, Any]:
    record, module = Record(), ParityModule(device_type)
    trainer = Trainer(accelerator=device_type, devices=1, strategy=DDPStrategy(), precision=precision, max_steps=STEPS,
                      callbacks=[record], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=2, default_root_dir=root)
    trainer.fit(module, train_dataloaders=_loader(), val_dataloaders=_loader())
    return {"losses": record.losses, **record.seen, "val_loss": float(trainer.callback_metrics["val_loss"]),
            "autocast": module.autocast_seen,
            "params": {name: value.detach().cpu() for name, value in module.net.state_dict().items()}}


def torch_ddp(precision: str, device_type: str) -> dict[str, Any]:
    cuda = device_type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        device = torch.device(device_type, 0) if cuda else torch.device("cpu")
        net = _net().to(device)
        model = DistributedDataParallel(net, device_ids=[0] if cuda else None)
        optimizer, losses = _optimizer(model.parameters()), []
        for x, y in _loader(in_ddp_order=True):
            autocast = (torch.autocast(device_type, dtype=torch.bfloat16) if precision == "bf16-mixed"
                        else contextlib.nullcontext())
            with autocast:
                loss = _loss(model, x.to(device), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        return {"losses": losses, "params": {name: value.detach().cpu() for name, value in net.state_dict().items()}}
    finally:
        dist.destroy_process_group()


def main(precision: str, out: str, device_type: str = "cuda") -> None:
    if device_type == "cuda":
        torch.cuda.set_device(0)
    mine = ours(precision, str(Path(out).parent), device_type)
    reference = torch_ddp(precision, device_type)
    param_diff = max(float((mine["params"][name] - value).abs().max()) for name, value in reference["params"].items())
    loss_diff = max(abs(a - b) for a, b in zip(mine["losses"], reference["losses"]))
    Path(out).write_text(json.dumps({
        "backend": mine["backend"], "world_size": mine["world_size"], "param_device": mine["param_device"],
        "losses": mine["losses"], "reference_losses": reference["losses"], "val_loss": mine["val_loss"],
        "autocast": mine["autocast"],
        "max_param_diff": param_diff, "max_loss_diff": loss_diff}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
