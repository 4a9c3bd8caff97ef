"""A torch.compile backend for tests: AOTAutograd without code generation (fast on the CPU) that
records each graph it compiles, so a test sees that compiled code ran, and in how many pieces."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

LOG_VARIABLE = "DDP_TRAINER_TEST_COMPILE_LOG"


def recording_aot_eager(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    from torch._dynamo.backends.registry import lookup_backend

    log = os.environ.get(LOG_VARIABLE)
    if log:
        with Path(log).open("a") as handle:
            rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))  # Lightning's launcher sets LOCAL_RANK
            handle.write(f"{rank} {len(list(gm.parameters())) + len(example_inputs)}\n")
    return lookup_backend("aot_eager")(gm, example_inputs)


def graphs_compiled(log: Path) -> dict[int, int]:
    """How many graphs each rank compiled."""
    counts: dict[int, int] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        rank = int(line.split()[0])
        counts[rank] = counts.get(rank, 0) + 1
    return counts


class MlpSteps:
    """The body of the compiled-training tests' module, mixed in before our LightningModule or
    Lightning's (as benchmarks/workloads.BenchSteps is): the same seed, layers and optimizer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.mse_loss(self(batch[0]), batch[1])  # type: ignore[operator]

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)  # type: ignore[attr-defined]
