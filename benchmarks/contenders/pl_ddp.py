"""pytorch_lightning.Trainer(strategy="ddp"): Lightning's own DDP (torch's DistributedDataParallel).
On CPU, "ddp" re-runs this command for ranks 1..n-1, so it must stay a real entry point."""

from __future__ import annotations

from benchmarks.contenders.data import loader, workload
from benchmarks.contenders.lightning_parts import fit
from benchmarks.probe import Probe, parse_args


def main() -> None:
    args = parse_args()
    probe, work = Probe(args), workload(args)
    fit("ddp", args, work, probe, loader(work, probe.total_steps, args.devices))


if __name__ == "__main__":
    main()
