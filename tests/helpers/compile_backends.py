"""A torch.compile backend for tests: AOTAutograd without code generation (fast on the CPU) that
records each graph it compiles, so a test sees that compiled code ran, and in how many pieces."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

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
