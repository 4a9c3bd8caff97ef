"""One process on one device: the strategy for `devices=1`, and the reference the DDP
strategy must match on the global batch."""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from strategies.base import Strategy, resolve_accelerator


class SingleDeviceStrategy(Strategy):
    """Runs the loop in the calling process on `cpu` or `cuda:0`; every collective is the identity."""

    @override
    def configure(self, *, accelerator: str | None = None, devices: int = 1, num_nodes: int = 1) -> None:
        if devices * num_nodes != 1:
            raise ValueError(f"SingleDeviceStrategy runs one process on one device, but devices={devices} and "
                             f"num_nodes={num_nodes} were requested; use strategy='ddp' for more than one, "
                             f"or devices=1, num_nodes=1.")
        super().configure(accelerator=accelerator, devices=devices, num_nodes=num_nodes)

    @override
    def setup_environment(self) -> None:
        self.accelerator = resolve_accelerator(self.accelerator)
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)

    @override
    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "device": str(self.root_device)}
