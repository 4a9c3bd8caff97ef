"""pytorch_lightning.Trainer with our reducer: `LightningDDPStrategy` (registered as "bucket_ddp")."""

from __future__ import annotations

from benchmarks.contenders.data import loader, workload
from benchmarks.contenders.lightning_parts import fit
from benchmarks.probe import Probe, parse_args


def main() -> None:
    args = parse_args()
    from strategies.lightning import LightningDDPStrategy

    probe, work = Probe(args), workload(args)
    fit(LightningDDPStrategy(), args, work, probe, loader(work, probe.total_steps, args.devices))


if __name__ == "__main__":
    main()
