"""Bytes per parameter per rank with `zero_stage=0` and `1`, measured, against ZeRO's formulas.

    python -m benchmarks.zero_memory                 # the mlp workload (~8.4M parameters), AdamW, 2 ranks
    python -m benchmarks.zero_memory --devices 3 --steps 2

Each rank counts, after a few AdamW steps, the bytes of the tensors it holds for training: its weights,
its gradient buffers (the reducer's buckets, padding included) and its optimizer state. With fp32 weights
(also under bf16-mixed) the formulas are 16 bytes per parameter for plain DDP (4 weights + 4 gradients +
8 Adam moments) and 8 + 8/N for stage 1 (the moments divided over the N ranks).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.workloads import WORKLOADS
from strategies import DDPStrategy
from strategies.zero import state_bytes
from trainer import LightningModule, Trainer
from trainer.callbacks import Callback

MIB = 2**20


class _Net(LightningModule):
    def __init__(self, workload: str) -> None:
        super().__init__()
        self.model = WORKLOADS[workload].model()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self.model(x)
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class _Count(Callback):
    """At the end of fit, each rank writes what it holds."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: Any, module: Any) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        reducer = trainer.strategy.summary()["reducer"]
        record = {
            "parameters": sum(p.numel() for p in params),
            "weights": sum(p.numel() * p.element_size() for p in params),
            "gradients": round(sum(reducer["bucket_sizes_mib"]) * MIB),
            "optimizer_state": sum(state_bytes(optimizer) for optimizer in trainer.optimizers),
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def measure(workload: str, zero_stage: int, devices: int, steps: int) -> list[dict[str, int]]:
    net = _Net(workload)
    loader = torch.utils.data.DataLoader(WORKLOADS[workload].dataset(8 * steps * devices), batch_size=8)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(accelerator="cpu", devices=devices, strategy=DDPStrategy(zero_stage=zero_stage),
                          max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, callbacks=[_Count(out)])
        trainer.fit(net, loader)
        return [json.loads(Path(out, f"rank{rank}.json").read_text()) for rank in range(devices)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zero_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    n = args.devices
    formulas = {0: (16.0, "16"), 1: (8 + 8 / n, f"8+8/N = {8 + 8 / n:g}")}
    print(f"{args.workload}, AdamW, fp32 weights, {n} ranks: bytes per parameter per rank")
    print(f"{'zero_stage':>10} {'rank':>4} {'weights':>8} {'grads':>6} {'state':>6} {'total':>6}  formula")
    for stage in (0, 1):
        for rank, record in enumerate(measure(args.workload, stage, n, args.steps)):
            count = record["parameters"]
            parts = [record[key] / count for key in ("weights", "gradients", "optimizer_state")]
            print(f"{stage:>10} {rank:>4} {parts[0]:>8.3f} {parts[1]:>6.3f} {parts[2]:>6.3f} {sum(parts):>6.3f}"
                  f"  {formulas[stage][1]}")


if __name__ == "__main__":
    from benchmarks import zero_memory  # the workers unpickle the module's classes by this name, not __main__'s

    zero_memory.main()
