"""Which optimizer step every rank stops after, once any rank holds a preemption notice.

Ranks learn of a notice at different moments (one rank was signalled, or all at slightly different
times), yet must stop at the same step boundary or the next collective pairs unrelated operations.
Every rank calls `due(stepped)` at each boundary where it could stop, in the same sequence on every
rank (`stepped`: optimizer steps so far). A rank holding a notice at boundary `c` publishes "stop at
the first boundary with stepped >= c + every" in the rendezvous store (first writer wins); every
rank stops at the first boundary with `stepped >= S`, which is the same boundary on every rank.

Why every rank knows S in time: no rank can have finished boundary c + 1 when S is written, because
between two boundaries every rank meets every other, in the gradient all-reduce of the step or, for
a step without one (manual optimization that skipped backward), in a barrier the watch adds there.
The writer meets them only after writing. Each rank reads the key whenever `(stepped + rank) //
every` has changed since its last read, which happens at some boundary after c and no later than
the first boundary with stepped >= c + every, even when steps jump (several optimizers per batch).
`every` (`reads_every`) staggers the reads of a large job over several steps, so the store answers
about `_READERS_PER_STEP` reads per step whatever the number of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_READERS_PER_STEP = 128  # loopback round trips of ~50 us each; a TCPStore serves thousands per second


def reads_every(world_size: int) -> int:
    """Steps between two reads of one rank: 1 up to 128 ranks, 8 at 1024 ranks."""
    return max(1, -(-world_size // _READERS_PER_STEP))


@dataclass
class StopAgreement:
    """One fit's agreement. `store` is the rendezvous store (None with one process: a notice stops
    at the boundary that sees it); `key` is the same on every rank and new for each fit."""

    store: Any = None
    key: str = "ddp_trainer/preemption/stop_after"
    rank: int = 0
    every: int = 1
    stop_after: int | None = None
    signal_name: str | None = None
    _published: bool = field(default=False, repr=False)
    _last_window: int | None = field(default=None, repr=False)

    def due(self, stepped: int, notice: str | None) -> bool:
        """Whether to stop at this boundary; `notice` is the signal this rank holds, if any."""
        if self.stop_after is None:
            self._learn(stepped, notice)
        return self.stop_after is not None and stepped >= self.stop_after

    def _learn(self, stepped: int, notice: str | None) -> None:
        if self.store is None:
            if notice is not None:
                self.stop_after, self.signal_name = stepped, notice
            return
        if notice is not None and not self._published:
            self._published = True
            self._adopt(self.store.compare_set(self.key, "", f"{stepped + self.every}:{notice}"))
            return
        window = (stepped + self.rank) // self.every
        if window != self._last_window:
            self._last_window = window
            if self.store.check([self.key]):
                self._adopt(self.store.get(self.key))

    def _adopt(self, raw: bytes) -> None:
        step, _, name = raw.decode().partition(":")
        self.stop_after, self.signal_name = int(step), name
