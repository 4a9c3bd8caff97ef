"""What a stage's global rank 0 sends back to the launching process (trainer/run.py builds it,
`Trainer._absorb` adopts it): its own module, so that the Trainer and the stage runner need not
import each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageResult:
    """What global rank 0 sends back to the launching process after a stage."""

    pid: int
    output: Any = None
    state_dict: dict[str, Any] = field(default_factory=dict)
    loop_state: dict[str, Any] = field(default_factory=dict)
    callback_states: dict[str, Any] = field(default_factory=dict)
    callback_metrics: dict[str, Any] = field(default_factory=dict)
    logged_metrics: dict[str, Any] = field(default_factory=dict)  # tensors on the CPU, as rank 0 logged them
    progress_bar_metrics: dict[str, float] = field(default_factory=dict)
    ckpt_path: str | None = None
    interrupted: bool = False
