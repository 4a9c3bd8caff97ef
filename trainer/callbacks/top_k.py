"""Ranking checkpoints by a monitored score: which settings can rank, what a score is, whether a
new one enters the top k, and which kept entries are now the best and the k-th.

ModelCheckpoint owns the bookkeeping (`best_k_models`, `best_model_path`, ... are its public,
resumable attributes, as in Lightning); these functions decide from it without changing it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

WORST = {"min": math.inf, "max": -math.inf}  # per mode: a score every real score beats


def validate_ranking(monitor: str | None, mode: str, save_top_k: int) -> None:
    """The ranking arguments of ModelCheckpoint, checked where they are consumed."""
    if mode not in WORST:
        raise ValueError(f"ModelCheckpoint(mode={mode!r}) is not supported; expected 'min' or 'max'.")
    if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < -1:
        raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k!r}) must be an int >= -1 "
                         "(-1 keeps every checkpoint, 0 saves none, k keeps the k best).")
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) cannot rank checkpoints; "
                         "pass monitor='<logged metric>' or use save_top_k in (-1, 0, 1).")


def score_of(value: Any, mode: str) -> torch.Tensor:
    """The monitored value as a 0-d float CPU tensor; a NaN never ranks above a real score."""
    current = torch.as_tensor(value).detach().float().cpu().reshape(())
    return torch.tensor(WORST[mode]) if torch.isnan(current) else current


def enters_top_k(best_k_models: dict[str, torch.Tensor], kth_best_model_path: str, current: torch.Tensor,
                 save_top_k: int, mode: str) -> bool:
    if save_top_k == -1 or len(best_k_models) < save_top_k:
        return True
    kth = best_k_models[kth_best_model_path]
    return bool(current < kth) if mode == "min" else bool(current > kth)


def best_and_worst(best_k_models: dict[str, torch.Tensor], mode: str) -> tuple[str, str]:
    """The paths of the best and the worst kept score; ties go to the oldest entry."""
    best, worst = (min, max) if mode == "min" else (max, min)

    def score(path: str) -> float:
        return float(best_k_models[path])

    return best(best_k_models, key=score), worst(best_k_models, key=score)
