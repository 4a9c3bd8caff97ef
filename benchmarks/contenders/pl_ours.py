"""pytorch_lightning.Trainer with our reducer: `LightningDDPStrategy` (registered as "bucket_ddp")."""

from __future__ import annotations

import argparse

from benchmarks.contenders.data import loader, workload
from benchmarks.contenders.lightning_parts import fit
from benchmarks.probe import Probe, parse_args


def main(args: argparse.Namespace | None = None) -> None:
    args = parse_args() if args is None else args
    from strategies.lightning import LightningDDPStrategy

    probe, work = Probe(args), workload(args)
    fit(LightningDDPStrategy(), args, work, probe, loader(work, probe.total_steps, args.devices))


if __name__ == "__main__":
    main()
