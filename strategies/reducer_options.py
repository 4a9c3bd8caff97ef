"""The options that shape a GradReducer, validated in one place.

Both our `DDPStrategy` and the Lightning plug-in (`strategies/lightning/core.py`) take them, and
both must fail in the launching process, before any worker starts, with the same message.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torch import nn

from strategies.autotune import AUTO, CapTuning, first_pass_cap_mb
from strategies.comm_hooks import CommHook, resolve_comm_hook
from strategies.cpu_memory import keep_freed_memory
from strategies.shm_transport import check_transport

if TYPE_CHECKING:
    from strategies.reducer import GradReducer


@dataclass(frozen=True)
class ReducerOptions:
    """`bucket_cap_mb` is a positive number of MiB or "auto" (timed during the first steps);
    `transport` is "auto", "shared_memory" or "process_group" (strategies/shm_transport.py);
    `zero_stage` 0 (every rank holds all optimizer state), 1 (each holds its 1/N shard: strategies/zero.py),
    2 (each also keeps only its shard of the averaged gradients: strategies/zero_reducer.py)."""

    bucket_cap_mb: float | str = 25.0
    first_bucket_cap_mb: float = 1.0
    gradient_as_bucket_view: bool = True
    comm_hook: str | CommHook | None = None
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    transport: str = "auto"
    zero_stage: int = 0

    def __post_init__(self) -> None:
        if self.bucket_cap_mb != AUTO:
            check_positive_number("bucket_cap_mb", self.bucket_cap_mb, alternative=repr(AUTO))
            object.__setattr__(self, "bucket_cap_mb", float(self.bucket_cap_mb))
        check_positive_number("first_bucket_cap_mb", self.first_bucket_cap_mb)
        object.__setattr__(self, "first_bucket_cap_mb", float(self.first_bucket_cap_mb))
        for name in ("gradient_as_bucket_view", "find_unused_parameters", "broadcast_buffers"):
            check_bool(name, getattr(self, name))
        resolve_comm_hook(self.comm_hook)  # names the accepted hooks on a bad value
        check_transport(self.transport)
        check_zero_stage(self.zero_stage, self.bucket_cap_mb, self.gradient_as_bucket_view, self.comm_hook)

    def attach(self, module: nn.Module, *, timeout: timedelta,
               adopted_mb: float | None = None) -> tuple[GradReducer, CapTuning | None]:
        """A GradReducer on `module` shaped by these options, with its bucket-cap tuning (None unless
        bucket_cap_mb="auto"; `adopted_mb` is the cap a checkpoint's tuning already settled on)."""
        from strategies.reducer import GradReducer  # in workers only: `import strategies` stays light
        from strategies.zero_reducer import ShardedGradReducer

        kind = ShardedGradReducer if self.zero_stage else GradReducer
        reducer = kind(module, bucket_cap_mb=first_pass_cap_mb(self.bucket_cap_mb),
                              first_bucket_cap_mb=self.first_bucket_cap_mb,
                              gradient_as_bucket_view=self.gradient_as_bucket_view, comm_hook=self.comm_hook,
                              find_unused_parameters=self.find_unused_parameters, transport=self.transport,
                              timeout=timeout, zero_stage=self.zero_stage)
        if reducer.world_size > 1 and all(param.device.type == "cpu" for param in reducer.parameters):
            keep_freed_memory()  # a CPU rank: each step's freed blocks are reused, not faulted in again
        return reducer, CapTuning.attach(reducer, self.bucket_cap_mb, adopted_mb=adopted_mb)

    def graph_split_caps(self, adopted_mb: float | None = None) -> tuple[float, float]:
        """Where a compiled graph is split so its pieces end where the buckets do: the cap the reducer
        starts with (or the one a checkpoint's tuning settled on) and the first bucket's cap."""
        return adopted_mb or first_pass_cap_mb(self.bucket_cap_mb), float(self.first_bucket_cap_mb)

    def summary(self) -> dict[str, Any]:
        """The options as plain values for reports (a comm hook function by its name)."""
        return {**dataclasses.asdict(self), "comm_hook": getattr(self.comm_hook, "__name__", self.comm_hook)}


def option_property(name: str) -> Any:
    """A strategy attribute that reads `self.reducer_options.<name>`: the options stay the one copy."""
    return property(lambda strategy: getattr(strategy.reducer_options, name),
                    doc=f"The reducer option `{name}` this strategy was built with (read-only).")


def check_positive_number(name: str, value: Any, unit: str = "MiB", alternative: str = "") -> None:
    """TypeError for something that is not a number, ValueError for one that is not > 0; the message
    reads `name=value must be ...`, so the CLI prefixes it with the group to name the key."""
    expected = f"must be a number of {unit} > 0" + (f" or {alternative}" if alternative else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} {expected}.")
    if not float(value) > 0:
        raise ValueError(f"{name}={value!r} {expected}.")


ZERO_STAGES = (0, 1, 2)


def check_zero_stage(zero_stage: Any, bucket_cap_mb: Any, gradient_as_bucket_view: bool,
                     comm_hook: Any = None) -> None:
    """`zero_stage` is 0, 1 or 2; above 0 the shards are cut from buckets fixed at setup (so not "auto", which
    re-plans them) whose buffers are the gradients (`gradient_as_bucket_view`), and each bucket is
    reduce-scattered (so no comm hook: a hook all-reduces a whole bucket)."""
    if isinstance(zero_stage, bool) or zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage={zero_stage!r} is not one of {list(ZERO_STAGES)}: 0 keeps all optimizer "
                         "state on every rank, 1 shards it over the ranks, 2 shards the gradients too.")
    if zero_stage == 0:
        return
    if comm_hook not in (None, "mean") and comm_hook is not resolve_comm_hook("mean"):
        name = getattr(comm_hook, "__name__", comm_hook)
        raise ValueError(f"zero_stage={zero_stage} reduce-scatters each bucket (every rank receives only its shard "
                         f"of the averaged gradients), so comm_hook={name!r}, which all-reduces whole buckets, cannot "
                         "run. Leave comm_hook unset (the mean), or use zero_stage=0 for it.")
    if bucket_cap_mb == AUTO:
        raise ValueError(f"zero_stage={zero_stage} needs a fixed bucket_cap_mb: the optimizer's shards are cut from "
                         "the buckets, which bucket_cap_mb='auto' re-plans. Pass a number of MiB (e.g. 25).")
    if gradient_as_bucket_view is not True:
        raise ValueError(f"zero_stage={zero_stage} needs gradient_as_bucket_view=True: each rank's optimizer steps "
                         "on its shard of the bucket buffers, which must be the gradients themselves.")


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be True or False.")
