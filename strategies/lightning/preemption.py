"""Preemption notices inside Lightning's own Trainer, for `LightningDDPStrategy`.

Lightning reacts to SIGTERM by broadcasting a flag from its signal handler and raising
`SIGTERMException` on the ranks that see it, and to SLURM's SIGUSR1 by writing `hpc_ckpt_<n>.ckpt`
from inside the handler, wherever the ranks are. With the notice on one rank only, the ranks can then
stop at different batches (or pair a handler's broadcast with another collective). So while fitting
we hold the notice signals ourselves (strategies/preemption.py: the ranks agree on a step through the
rendezvous store) and use Lightning's own machinery for the rest:

* at the agreed step every rank sets `trainer.received_sigterm`, so Lightning's epoch loop raises its
  `SIGTERMException` at the end of that batch (after validation, on every rank alike);
* in `on_exception` every rank takes part in `trainer.save_checkpoint` to Lightning's SLURM checkpoint
  path, which Lightning resumes from by itself on SLURM (`ckpt_path=None`) and on request elsewhere
  (`ckpt_path="hpc"`); rank 0 requeues the job on SLURM, and the exception's exit code becomes 75
  (Lightning's is 0: a Kubernetes Job would count a preempted run as succeeded, torchrun would not
  restart it).

Nothing here imports Lightning: the Trainer is handed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from strategies import process_group
from strategies.preemption import PREEMPTED_EXIT_CODE, PreemptionPolicy, PreemptionWatch, next_fit_key
from strategies.rank_zero import rank_zero_info


class LightningPreemption:
    """One strategy's notice handling across its fits (opened in `on_train_start`, closed at the end)."""

    def __init__(self, policy: PreemptionPolicy) -> None:
        self.policy = policy
        self.watch: PreemptionWatch | None = None

    def start(self, global_rank: int, syncs: Callable[[], int]) -> None:
        """After Lightning registered its own handlers (which this replaces for the notice signals);
        `syncs` counts the reducer's synchronised backward passes."""
        if not self.policy.enabled:
            return
        store = process_group.shared_store()
        self.watch = PreemptionWatch(self.policy, store, next_fit_key(process_group.restart_count()), global_rank,
                                     dist.get_world_size() if store is not None else 1, meet=dist.barrier, syncs=syncs)
        self.watch.__enter__()

    def at_batch_start(self, trainer: Any) -> None:
        """Every rank, every training batch: once the ranks agree, Lightning stops after this batch."""
        if self.watch is not None and self.watch.due(trainer.global_step):
            trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer: Any, exception: BaseException) -> None:
        """Lightning's SIGTERMException, raised on every rank at the agreed batch: write the checkpoint."""
        watch = self.watch
        if watch is None or watch.agreement.stop_after is None or type(exception).__name__ != "SIGTERMException":
            return
        path = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
        trainer.save_checkpoint(path)
        notice = watch.stopped(trainer.global_step, path)
        exception.code = PREEMPTED_EXIT_CODE  # type: ignore[attr-defined]  # a SystemExit's status
        rank_zero_info(f"{notice} (resume with ckpt_path='hpc'; on SLURM Lightning resumes from it by itself).")

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.__exit__(None, None, None)
            self.watch = None
