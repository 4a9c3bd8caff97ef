"""Bytes per parameter per rank with `zero_stage` 0, 1 and 2, measured, against ZeRO's formulas.

    python -m benchmarks.zero_memory                 # the mlp workload (~8.4M parameters), AdamW, 2 ranks
    python -m benchmarks.zero_memory --devices 3 --steps 2 --accumulate 4

Each rank counts, after a few AdamW steps, the bytes of the tensors it holds for training between steps: its
weights, its gradients (the reducer's buckets, padding included; at stage 2 only its shard of them) and its
optimizer state. With fp32 weights (also under bf16-mixed) the formulas are 16 bytes per parameter for plain
DDP (4 weights + 4 gradients + 8 Adam moments), 4 + 4 + 8/N for stage 1 (the moments divided over the N
ranks) and 4 + 12/N for stage 2 (the gradients too). Two more columns say what the formulas leave out:
`peak` is the most gradient memory the reducer held at once (stage 2: bucket buffers exist from their first
gradient of a pass to the end of their reduce-scatter), and `window` the largest local `.grad` memory seen
after a backward inside an accumulation window (`--accumulate` > 1: each rank's full local gradient).
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
    """At the end of fit, each rank writes what it holds; after each backward, the local `.grad` bytes."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.window = 0

    def on_after_backward(self, trainer: Any, module: Any) -> None:
        # autograd's own `.grad` tensors (a bucket slot is a view: it has a `_base`), i.e. gradients that
        # accumulated locally inside `no_sync`, beyond the reducer's memory
        local = sum(p.grad.numel() * p.grad.element_size() for p in module.parameters()
                    if p.grad is not None and p.grad._base is None)
        self.window = max(self.window, local)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        reducer = trainer.strategy.summary()["reducer"]
        buckets = round(sum(reducer["bucket_sizes_mib"]) * MIB)
        measured = reducer.get("gradient_bytes", {"held": buckets, "peak": buckets})  # stage 0: the buckets
        record = {
            "parameters": sum(p.numel() for p in params),
            "weights": sum(p.numel() * p.element_size() for p in params),
            "gradients": measured["held"],
            "gradient_peak": measured["peak"],
            "window": self.window,
            "optimizer_state": sum(state_bytes(optimizer) for optimizer in trainer.optimizers),
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def measure(workload: str, zero_stage: int, devices: int, steps: int, accumulate: int = 1,
            bucket_cap_mb: float = 25.0) -> list[dict[str, int]]:
    net = _Net(workload)
    samples = 8 * steps * devices * accumulate
    loader = torch.utils.data.DataLoader(WORKLOADS[workload].dataset(samples), batch_size=8)
    with tempfile.TemporaryDirectory() as out:
        strategy = DDPStrategy(zero_stage=zero_stage, bucket_cap_mb=bucket_cap_mb)
        trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy,
                          max_steps=steps, accumulate_grad_batches=accumulate, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          callbacks=[_Count(out)])
        trainer.fit(net, loader)
        return [json.loads(Path(out, f"rank{rank}.json").read_text()) for rank in range(devices)]


def formulas(n: int) -> dict[int, str]:
    """ZeRO's bytes per parameter per rank with Adam and fp32 weights, at N ranks."""
    return {0: "16", 1: f"4+4+8/N = {8 + 8 / n:g}", 2: f"4+12/N = {4 + 12 / n:g}"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zero_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches (the window column)")
    parser.add_argument("--stages", default="0,1,2")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="smaller buckets: a lower stage-2 peak")
    args = parser.parse_args(argv)
    n = args.devices
    print(f"{args.workload}, AdamW, fp32 weights, {n} ranks, accumulate_grad_batches={args.accumulate}, "
          f"bucket_cap_mb={args.bucket_cap_mb:g}: "
          "bytes per parameter per rank")
    print(f"{'zero_stage':>10} {'rank':>4} {'weights':>8} {'grads':>6} {'state':>6} {'total':>6}  {'formula':<16}"
          f" {'peak':>6} {'window':>6}")
    for stage in (int(value) for value in args.stages.split(",")):
        records = measure(args.workload, stage, n, args.steps, args.accumulate, args.bucket_cap_mb)
        for rank, record in enumerate(records):
            count = record["parameters"]
            parts = [record[key] / count for key in ("weights", "gradients", "optimizer_state")]
            print(f"{stage:>10} {rank:>4} {parts[0]:>8.3f} {parts[1]:>6.3f} {parts[2]:>6.3f} {sum(parts):>6.3f}"
                  f"  {formulas(n)[stage]:<16} {record['gradient_peak'] / count:>6.3f}"
                  f" {record['window'] / count:>6.3f}")


if __name__ == "__main__":
    from benchmarks import zero_memory  # the workers unpickle the module's classes by this name, not __main__'s

    zero_memory.main()
