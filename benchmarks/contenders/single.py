"""One process, no DDP: the same per-rank batch, all cores (torch's default threads), or one GPU."""

from __future__ import annotations

import torch

from benchmarks.contenders.data import device_for, loader, train_raw, workload
from benchmarks.probe import Probe, parse_args
from benchmarks.workloads import make_optimizer


def main() -> None:
    args = parse_args()
    probe, work, device = Probe(args), workload(args), device_for(args)
    model = work.model().to(device)
    if args.compile:
        model = torch.compile(model, backend=args.compile)
    train_raw(model, make_optimizer(work, model), loader(work, probe.total_steps, ranks=1), probe, 0, args, device)


if __name__ == "__main__":
    main()
