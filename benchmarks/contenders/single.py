"""One process, no DDP: the same per-rank batch, all cores (torch's default threads)."""

from __future__ import annotations

import torch

from benchmarks.contenders.data import loader, workload
from benchmarks.probe import Probe, parse_args
from benchmarks.workloads import loss_fn, make_optimizer


def main() -> None:
    args = parse_args()
    probe, work = Probe(args), workload(args)
    model = work.model()
    optimizer = make_optimizer(work, model)
    loss = torch.zeros(())
    for step, batch in enumerate(loader(work, probe.total_steps, ranks=1)):
        if step == probe.total_steps:
            break
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        probe.step_end()
    probe.finish(0, float(loss.detach()), {"threads": torch.get_num_threads()})


if __name__ == "__main__":
    main()
