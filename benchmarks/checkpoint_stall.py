"""What a checkpoint costs the training side: synchronous saves against background ones (#40).

One fit on 2 CPU processes (our DDPStrategy, gloo), a stack of Linear layers trained with Adam, so a
checkpoint (weights + Adam's two moments) is about 3 x 4 bytes per parameter: >= 500 MB by default. The
steps run in blocks that cycle through three modes, so slow drifts of a shared machine hit all alike:

* `none`: no saves (the throughput reference);
* `async`: `trainer.save_checkpoint(path, background=True)` every `--every` steps (what
  `async_checkpoint=True` makes ModelCheckpoint do): rank 0 copies the state, a thread writes it;
* `sync`: `trainer.save_checkpoint(path)` every `--every` steps: rank 0 writes, every rank waits.

Per save it records the stall on the training side (the time `save_checkpoint` held rank 0, whom the
other rank waits for at the save's barrier), and for background saves the snapshot copy and any wait
for the previous write. Before a synchronous save the previous background write is finished outside the
timed region, so the synchronous figure is the save alone. Throughput is steps per second of the
`async` blocks against the `none` blocks (a block's time includes its saves' stalls).

    python -m benchmarks.checkpoint_stall                       # ~42 M parameters: ~505 MB checkpoints
    python -m benchmarks.checkpoint_stall --width 1024 --cycles 1 --block 4 --every 2 --out ''  # a smoke run

Writes benchmarks/results/checkpoint_stall.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from strategies import DDPStrategy
from trainer import LightningModule, Trainer
from trainer.callbacks import Callback

MODES = ("none", "async", "sync")


class WideStack(LightningModule):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-5)


class RandomRows(Dataset):
    def __init__(self, width: int, rows: int) -> None:
        self.data = torch.randn(rows, width, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


class StallProbe(Callback):
    """Rank 0's clock: each step's end, and each save's stall, by block and mode."""

    def __init__(self, directory: str, block: int, every: int, warmup_blocks: int) -> None:
        self.directory, self.block, self.every, self.warmup_steps = directory, block, every, block * warmup_blocks
        self.step_ends: list[tuple[int, str, float]] = []
        self.saves: list[dict[str, Any]] = []

    def mode_of(self, step: int) -> str:
        return MODES[((step - 1) // self.block) % len(MODES)]

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        mode = self.mode_of(step)
        position = (step - 1) % self.block + 1
        if step <= self.warmup_steps:  # one untimed save of each kind: snapshot buffers allocated, files exist
            if step in (1, 1 + self.every):
                self._save(trainer, step, "async" if step == 1 else "sync")
        elif mode != "none" and (position - 1) % self.every == 0:  # from a block's first step: writes overlap it
            self._save(trainer, step, mode)
        self.step_ends.append((step, mode, time.perf_counter()))

    def _save(self, trainer: Any, step: int, mode: str) -> None:
        strategy = trainer.strategy
        before = strategy.checkpoint_stats.as_dict() if trainer.is_global_zero else {}
        finish_s = 0.0
        if mode == "sync":  # the previous background write ends outside the timed region
            start = time.perf_counter()
            strategy.finish_checkpoints()
            finish_s = time.perf_counter() - start
        path = os.path.join(self.directory, f"{mode}.ckpt")
        start = time.perf_counter()
        trainer.save_checkpoint(path, background=mode == "async")
        stall_s = time.perf_counter() - start
        record = {"step": step, "mode": mode, "stall_s": stall_s, "finished_previous_write_s": finish_s}
        if trainer.is_global_zero and mode == "async":
            after = strategy.checkpoint_stats.as_dict()
            record["snapshot_s"] = after["snapshot_s"] - before["snapshot_s"]
            record["waited_for_previous_write_s"] = after["wait_s"] - before["wait_s"]
        self.saves.append(record)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        trainer.strategy.finish_checkpoints()


def _block_rates(probe: StallProbe, skip_blocks: int) -> dict[str, list[float]]:
    """Steps per second of each block after the warm-up, by mode: from the end of the previous block's last
    step to the end of its own last step, so its saves' stalls are inside."""
    ends = {step: end for step, _, end in probe.step_ends}
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    for index in range(max(skip_blocks, 1), max(ends) // probe.block):
        first, last = index * probe.block, (index + 1) * probe.block
        if first in ends and last in ends:
            rates[probe.mode_of(first + 1)].append(probe.block / (ends[last] - ends[first]))
    return rates


def summarise(probe: StallProbe, checkpoint_bytes: int, args: argparse.Namespace, wall_s: float) -> dict[str, Any]:
    saves = [save for save in probe.saves if save["step"] > args.block * args.warmup_blocks]
    by_mode = {mode: [save["stall_s"] for save in saves if save["mode"] == mode] for mode in ("async", "sync")}
    snapshots = [save["snapshot_s"] for save in saves if "snapshot_s" in save]
    rates = _block_rates(probe, args.warmup_blocks)
    median = {mode: statistics.median(values) if values else None for mode, values in by_mode.items()}
    rate = {mode: statistics.median(values) if values else None for mode, values in rates.items()}
    return {
        "checkpoint_mb": checkpoint_bytes / 2**20, "parameters": args.width * (args.width + 1) * args.layers,
        "processes": 2, "threads_per_process": torch.get_num_threads(), "loadavg_before": args.loadavg_before,
        "loadavg_after": list(os.getloadavg()), "wall_s": wall_s, "settings": vars(args) | {"loadavg_before": None},
        "stall_s": {mode: {"median": median[mode], "all": by_mode[mode]} for mode in by_mode},
        "snapshot_s": {"median": statistics.median(snapshots) if snapshots else None, "all": snapshots},
        "sync_over_async_stall": (median["sync"] / median["async"]) if median["sync"] and median["async"] else None,
        "steps_per_s": {mode: {"median": rate[mode], "blocks": rates[mode]} for mode in MODES},
        "async_over_none_throughput": (rate["async"] / rate["none"]) if rate["async"] and rate["none"] else None,
        "saves": probe.saves,
    }


def table(result: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:,.0f} ms"

    rate = result["steps_per_s"]
    lines = [f"checkpoint {result['checkpoint_mb']:.0f} MB, {result['parameters'] / 1e6:.1f} M parameters, "
             f"2 processes; load before {result['loadavg_before']}, after {result['loadavg_after']}",
             "| | median stall per save | saves | steps/s (median block) |", "|---|---:|---:|---:|",
             f"| no saves | - | 0 | {rate['none']['median'] or 0:.3f} |",
             f"| background (async) | {ms(result['stall_s']['async']['median'])} "
             f"(snapshot {ms(result['snapshot_s']['median'])}) | {len(result['stall_s']['async']['all'])} "
             f"| {rate['async']['median'] or 0:.3f} |",
             f"| synchronous | {ms(result['stall_s']['sync']['median'])} | {len(result['stall_s']['sync']['all'])} "
             f"| {rate['sync']['median'] or 0:.3f} |"]
    ratio, throughput = result["sync_over_async_stall"], result["async_over_none_throughput"]
    lines.append(f"sync/async stall: {ratio:.1f}x; async throughput / no saves: {throughput:.3f}"
                 if ratio and throughput else "(too few blocks for ratios)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=3328)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2, help="per process")
    parser.add_argument("--block", type=int, default=4, help="steps per block of one mode")
    parser.add_argument("--every", type=int, default=2, help="steps between saves inside an async/sync block")
    parser.add_argument("--cycles", type=int, default=2, help="none/async/sync cycles after the warm-up block")
    parser.add_argument("--warmup-blocks", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary directory)")
    parser.add_argument("--out", default="benchmarks/results/checkpoint_stall.json")
    args = parser.parse_args(argv)
    args.loadavg_before = list(os.getloadavg())
    steps = args.block * (args.warmup_blocks + len(MODES) * args.cycles)
    if args.dir is not None:
        os.makedirs(args.dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        probe = StallProbe(directory, args.block, args.every, args.warmup_blocks)
        trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(), max_steps=steps, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          enable_telemetry=False, callbacks=[probe], default_root_dir=directory)
        torch.manual_seed(0)
        loader = DataLoader(RandomRows(args.width, args.batch * 2 * 4), batch_size=args.batch)
        started = time.perf_counter()
        trainer.fit(WideStack(args.width, args.layers), train_dataloaders=loader)
        wall_s = time.perf_counter() - started
        checkpoint_bytes = max(path.stat().st_size for path in Path(directory).glob("*.ckpt"))
    result = summarise(probe, checkpoint_bytes, args, wall_s)
    print(table(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
