"""One process, no DDP: the same per-rank batch, all cores (torch's default threads)."""

from __future__ import annotations

from benchmarks.contenders.data import loader, train_raw, workload
from benchmarks.probe import Probe, parse_args
from benchmarks.workloads import make_optimizer


def main() -> None:
    args = parse_args()
    probe, work = Probe(args), workload(args)
    model = work.model()
    train_raw(model, make_optimizer(work, model), loader(work, probe.total_steps, ranks=1), probe, rank=0)


if __name__ == "__main__":
    main()
