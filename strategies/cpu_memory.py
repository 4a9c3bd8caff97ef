"""CPU ranks keep the memory they free for the next step instead of handing it back to the kernel (glibc).

Why: a training step frees and allocates the same large blocks every time (the gradients after
`zero_grad(set_to_none=True)`, the activations after backward). glibc gives such blocks back to the kernel at
once: a block at or above its mmap threshold (128 KiB, adapting up to 32 MiB) is unmapped when freed, and free
memory at the top of the heap beyond its trim threshold is released. Using it again next step costs a page fault
and a freshly zeroed page per 4 KiB: on the project's 2-core CPU rank 0 of a 2-rank fit of the benchmark CNN
took ~1,900 faults and 10 ms of kernel time a step (a plain loop of the 8.4M-parameter mlp ~5,000 faults).
With both thresholds raised, freed blocks stay in the process and are reused: 39 faults and 1.8 ms. torch's own CPU launcher
(`python -m torch.backends.xeon.run_cpu`) does the same with jemalloc and decay times of days.

What it costs: memory the process frees stays resident until it exits (the peak of a step stays resident, as it
does during training anyway); blocks over 32 MiB still come and go. A user who set any glibc malloc tunable
(`MALLOC_*_` variables, `GLIBC_TUNABLES` with `glibc.malloc`) decided already: then nothing is changed, as
`OMP_NUM_THREADS` decides a rank's threads. Elsewhere than glibc nothing is changed either.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's ceiling for the mmap threshold on 64-bit
_TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt takes an int: keep up to 2 GiB free at the top of the heap
_applied: bool | None = None  # once per process
_log = logging.getLogger(__name__)


def keep_freed_memory() -> bool:
    """Make this process keep the blocks it frees for reuse (see the module docstring); whether it does now.
    Idempotent; leaves a user's own malloc settings and non-glibc platforms alone."""
    global _applied
    if _applied is None:
        _applied = _set_thresholds() if _allocator_is_ours_to_tune() else False
    return _applied


def _allocator_is_ours_to_tune() -> bool:
    if platform.libc_ver()[0] != "glibc":
        return False
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "glibc.malloc" not in tunables and not any(
        name.startswith("MALLOC_") and name.endswith("_") for name in os.environ)


def _set_thresholds() -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The mmap threshold first: setting either one fixes both (glibc stops adapting them).
    done = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD,
                                                                              _TRIM_THRESHOLD_BYTES) == 1
    if not done:
        _log.info("glibc refused the malloc thresholds; freed memory goes back to the kernel as before.")
    return done
