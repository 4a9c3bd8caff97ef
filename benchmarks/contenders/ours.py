"""Our Trainer with our DDPStrategy (`--comm-hook bf16`, `--bucket-cap-mb N|auto`, `--transport T`, `--zero-stage 1`
for variants; `--on-nonfinite ignore` and `--telemetry off` price those two defaults).

Logging, checkpointing, the progress bar and the model summary are off, as for the Lightning
contenders; the TelemetryMonitor stays, since it is on by default.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from benchmarks.contenders.data import loader, workload
from benchmarks.contenders.ours_parts import BenchModule, ProbeCallback
from benchmarks.probe import Probe, parse_args
from strategies import DDPStrategy
from trainer import Trainer


def _bucket_cap(value: str | None) -> float | str:
    if value is None:
        return 25.0
    return value if value == "auto" else float(value)


def _ensure_telemetry(trainer: Trainer) -> None:
    """Telemetry is part of the default configuration; add it if this Trainer does not already."""
    if any(type(c).__name__ == "TelemetryMonitor" for c in trainer.callbacks):
        return
    try:
        from trainer.callbacks.telemetry import TelemetryMonitor
    except ImportError:  # an older checkout (BENCH_CODE_ROOT) without telemetry
        return
    trainer.callbacks.append(TelemetryMonitor(print_summary=False))


def main(args: argparse.Namespace) -> None:
    probe, work = Probe(args), workload(args)
    transport = {} if args.transport is None else {"transport": args.transport}  # older checkouts lack it
    zero: dict[str, Any] = {} if args.zero_stage is None else {"zero_stage": int(args.zero_stage)}  # so do they zero_stage
    strategy = DDPStrategy(comm_hook=args.comm_hook, bucket_cap_mb=_bucket_cap(args.bucket_cap_mb), **transport,
                           **zero)
    if args.telemetry not in (None, "on", "off"):
        raise SystemExit(f"--telemetry takes on or off, got {args.telemetry!r}")
    defaults: dict[str, Any] = {} if args.on_nonfinite is None else {"on_nonfinite": args.on_nonfinite}
    if args.telemetry == "off":
        defaults["enable_telemetry"] = False
    trainer = Trainer(accelerator=args.accelerator, precision=args.precision, devices=args.devices,
                      strategy=strategy, max_steps=probe.total_steps, **defaults,
                      callbacks=[ProbeCallback(probe)], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=args.out)
    if args.telemetry != "off":
        _ensure_telemetry(trainer)
    module = BenchModule(work)
    trainer.fit(torch.compile(module, backend=args.compile) if args.compile else module,
                train_dataloaders=loader(work, probe.total_steps, args.devices))


if __name__ == "__main__":
    main(parse_args(comm_hook=str, bucket_cap_mb=str, transport=str, zero_stage=str, on_nonfinite=str, telemetry=str))
