"""Hang guard: end a job whose ranks no longer meet in the same collective, naming who and where.

A rank that skips a collective (logs with `sync_dist` on one rank only, skips a step, takes a
rank-dependent branch) leaves its peers blocked until the process-group timeout; gloo and NCCL
cannot be interrupted from Python. So every tracked collective bumps a per-process sequence
number in the `LEDGER`, and a daemon thread per rank publishes (sequence, operation, how long it
has waited, where the main thread is) to the rendezvous store about once a second. A rank that
has waited a while reads its peers' reports and ends the job when they cannot meet:

* a peer waits in a *different* collective (another sequence number or operation): mismatch;
* a peer has finished its stage, or stopped reporting (frozen or gone), before reaching it;
* a peer has been doing something else (not in any collective) for `stall_timeout` seconds.

The verdict is printed with both ranks' call sites, stamped for the launcher (which reports the
earliest failure) and the process exits, because the blocked main thread cannot be woken.

`debug=True` adds fingerprints: before each collective every rank writes (operation, shapes,
dtypes, call site) under its sequence number and compares with the others, so the *first*
mismatch raises on every rank before gloo pairs unrelated messages (which aborts the process
or silently mixes data). It costs store round trips per collective: a debugging tool.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from strategies.rank_zero import rank_prefixed_message

FAILURES_DIR_VARIABLE = "DDP_TRAINER_FAILURES_DIR"  # set by our launcher: where a worker stamps its failure
HANG_EXIT_CODE = 3
_KEY_PREFIX = "ddp_trainer/hang_guard"
_LIBRARY_ROOTS = tuple(os.path.realpath(path) + os.sep for path in {
    Path(torch.__file__).parent.parent,  # site-packages: torch, Lightning, ...
    Path(contextlib.__file__).parent,  # the standard library
})
_OUR_ROOTS = tuple(os.path.realpath(Path(__file__).parent.parent / name) for name in ("strategies", "trainer"))


class CollectiveMismatchError(RuntimeError):
    """Ranks issued different collectives at the same position (found by the debug fingerprints)."""


@dataclass
class RankReport:
    """What one rank publishes: its place in the collective sequence and where it is."""

    rank: int
    beat: int = 0  # bumped every publish: a report that stops changing belongs to a frozen or gone rank
    seq: int = 0  # tracked collectives started so far
    op: str = ""  # the latest one
    waiting_s: float | None = None  # seconds blocked in `op`, None when not in a collective
    local_work: str | None = None  # rank-local work peers may legitimately wait for (saving a checkpoint)
    done: bool = False  # the stage finished: this rank issues no more collectives in it
    stage: int = 0  # stages (fit, test, ...) this process has started: the same count on every rank
    site: str = ""  # where the main thread is

    def describe(self) -> str:
        if self.done:
            return f"rank {self.rank} has finished the stage after collective #{self.seq} ({self.op or 'none'})"
        if self.waiting_s is not None:
            return (f"rank {self.rank} waits in collective #{self.seq} {self.op} for {self.waiting_s:.0f} s "
                    f"at {self.site}")
        doing = f"doing {self.local_work}" if self.local_work else "not in any collective"
        return f"rank {self.rank} is {doing}: last collective #{self.seq} ({self.op or 'none'}), now at {self.site}"


class CollectiveLedger:
    """This process's position in the sequence of tracked collectives (one default group per process)."""

    def __init__(self) -> None:
        self.seq = 0
        self.op = ""
        self.waiting_since: float | None = None
        self.local_work: str | None = None
        self.stage = 0
        self.fits = 0
        self.guard: HangGuard | None = None
        # How a verdict ends this process's stage when the process must survive it (the launching
        # process is rank 0): None means exit, as a worker or a torchrun rank does.
        self.end_stage: Callable[[str], None] | None = None
        # Why this process's stage was given up while it may still wait for peers (a worker died);
        # a wait this process polls itself (the shared-memory all-reduce) stops at its next look.
        self.aborted: str | None = None

    def new_group(self) -> None:
        """A process group was just created: every rank of it counts from zero (the launching process
        may have counted a previous pool's collectives, which a fresh worker never saw)."""
        self.seq, self.op, self.stage, self.fits, self.aborted = 0, "", 0, 0, None

    def next_fit(self) -> int:
        """The number of this fit in the current group, the same on every rank."""
        self.fits += 1
        return self.fits

    def begin(self, op: str, *tensors: torch.Tensor) -> int:
        """Count one collective about to be issued; in debug mode check it against every rank first."""
        self.seq += 1
        self.op = op
        if self.guard is not None and self.guard.debug:
            self.guard.verify_fingerprint(self.seq, _fingerprint(op, tensors))
        return self.seq

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The calling thread blocks on the current collective(s) for the duration."""
        self.waiting_since = time.monotonic()
        try:
            yield
        finally:
            self.waiting_since = None

    @contextlib.contextmanager
    def collective(self, op: str, *tensors: torch.Tensor) -> Iterator[None]:
        """A blocking collective: counted, and marked as waited on while it runs."""
        self.begin(op, *tensors)
        with self.waiting():
            yield

    @contextlib.contextmanager
    def local_work_section(self, what: str) -> Iterator[None]:
        """Rank-local work (rank 0 writing a checkpoint) that peers may wait for without a verdict."""
        previous, self.local_work = self.local_work, what
        try:
            yield
        finally:
            self.local_work = previous

    def report(self, rank: int, beat: int, done: bool = False) -> RankReport:
        since = self.waiting_since
        return RankReport(rank=rank, beat=beat, seq=self.seq, op=self.op,
                          waiting_s=None if since is None else time.monotonic() - since,
                          local_work=self.local_work, done=done, stage=self.stage, site=main_thread_site())


LEDGER = CollectiveLedger()


class HangGuard:
    """The watchdog thread of one rank. Start it after the process group exists, stop it before
    the group goes away; `stop(finished=True)` tells peers this rank's stage is over."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, *, stall_timeout: float,
                 poll_s: float = 1.0, debug: bool = False) -> None:
        self.store = dist.PrefixStore(_KEY_PREFIX, store)
        self.rank, self.world_size = rank, world_size
        self.stall_timeout = stall_timeout
        # A peer in another collective is a mismatch once both have waited this long.
        self.mismatch_after = min(10.0, stall_timeout)
        self.poll_s = poll_s
        self.debug = debug
        self._beat = 0
        self._stop = threading.Event()
        self._last_beats: dict[int, tuple[int, float]] = {}  # peer -> (beat, when it last changed)
        self._suspect: str | None = None  # a mismatch seen once; confirmed if the next poll sees it again
        self._reported: set[str] = set()  # the watchdog's own unexpected errors, printed once each
        self._thread = threading.Thread(target=self._run, name="ddp-trainer-hang-guard", daemon=True)

    def start(self) -> HangGuard:
        LEDGER.stage += 1
        self._publish()  # before any wait, so peers find a report at once
        LEDGER.guard = self
        self._thread.start()
        # A daemon thread still inside a store call when the interpreter finalises is torn down
        # mid-C++ (std::terminate); a process that exits without teardown stops it first.
        atexit.register(self._stop_thread)
        return self

    def stop(self, *, finished: bool) -> None:
        atexit.unregister(self._stop_thread)
        self._stop_thread()
        if finished:
            with contextlib.suppress(Exception):  # the store may be gone already; nothing to tell then
                self._publish(done=True)

    def _stop_thread(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.poll_s)
        if LEDGER.guard is self:
            LEDGER.guard = None

    # ------------------------------------------------------------------ the watchdog
    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._publish()
                mine = LEDGER.report(self.rank, self._beat)
                if mine.waiting_s is not None and mine.waiting_s >= self.mismatch_after:
                    verdict = self._diagnose(mine, self._read_peers())
                    if verdict is not None and self._still_in(mine):
                        self._end_job(verdict)
            except (dist.DistError, ConnectionError):  # the store went away with the job: no say then
                if self._stop.is_set():
                    return
            except Exception as error:  # noqa: BLE001 - a bug here must not silently switch the guard off
                if self._stop.is_set():
                    return
                self._report_own_failure(error)

    def _report_own_failure(self, error: Exception) -> None:
        """Print the watchdog's own unexpected error (once per kind: it polls every second) and keep
        watching; the job goes on, but the user learns its hang protection may be impaired."""
        kind = f"{type(error).__name__}: {error}"
        if kind in self._reported:
            return
        self._reported.add(kind)
        details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        print(rank_prefixed_message(f"hang guard: unexpected error in its watchdog (it keeps running, but may not "
                                    f"detect a hang while this recurs):\n{details}", self.rank),
              file=sys.stderr, flush=True)

    def _publish(self, done: bool = False) -> None:
        self._beat += 1
        report = LEDGER.report(self.rank, self._beat, done=done)
        self.store.set(f"state/{self.rank}", json.dumps(asdict(report)))

    def _read_peers(self) -> dict[int, RankReport | None]:
        peers: dict[int, RankReport | None] = {}
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            key = f"state/{rank}"
            peers[rank] = RankReport(**json.loads(self.store.get(key))) if self.store.check([key]) else None
        return peers

    def _diagnose(self, mine: RankReport, peers: dict[int, RankReport | None]) -> str | None:
        """The reason the ranks cannot meet, or None while they still may."""
        assert mine.waiting_s is not None
        now = time.monotonic()
        for rank, peer in peers.items():
            silent_s = self._silent_for(rank, peer, now)
            if silent_s >= self.stall_timeout:
                return (f"rank {rank} has not reported for {silent_s:.0f} s (frozen or gone) while "
                        f"{mine.describe()}.")
            if peer is None:
                continue
            if peer.done and peer.stage >= mine.stage:  # after the stage's last barrier: it joins no more
                return f"{peer.describe()}, but {mine.describe()}: the ranks issued different collectives."
            if peer.done:  # the previous stage's report: the peer runs its own code before the next one
                peer = replace(peer, done=False, site=f"{peer.site} (between stages)")
            if (peer.waiting_s is not None and peer.waiting_s >= self.mismatch_after
                    and (peer.seq, peer.op) != (mine.seq, mine.op)):
                verdict = f"{mine.describe()}, but {peer.describe()}: the ranks issued different collectives."
                key = f"{rank}:{peer.seq}:{peer.op}:{mine.seq}:{mine.op}"
                confirmed, self._suspect = self._suspect == key, key
                if confirmed:
                    return verdict
            if peer.waiting_s is None and peer.local_work is None and mine.waiting_s >= self.stall_timeout:
                return (f"{mine.describe()}, but {peer.describe()} and has not joined it for "
                        f"{mine.waiting_s:.0f} s (stall_timeout).")
        return None

    def _still_in(self, mine: RankReport) -> bool:
        """Whether this rank still waits in the collective `mine` describes. Reading the peers takes time,
        in which the main thread may have left it and a peer may have finished the stage (on a busy machine
        this thread runs late); a verdict from such a stale snapshot would end a healthy job."""
        now = LEDGER.report(self.rank, self._beat)
        return now.waiting_s is not None and (now.seq, now.op, now.stage) == (mine.seq, mine.op, mine.stage)

    def _silent_for(self, rank: int, peer: RankReport | None, now: float) -> float:
        beat = -1 if peer is None else peer.beat
        last = self._last_beats.get(rank)
        if last is None or last[0] != beat:
            self._last_beats[rank] = (beat, now)
            return 0.0
        return now - last[1]

    def _end_job(self, verdict: str) -> None:
        message = rank_prefixed_message(
            f"hang guard: {verdict} A rank that skips a collective (self.log(..., sync_dist=True) or a step on "
            f"one rank only, rank-dependent control flow) blocks the others. Rerun with "
            f"DDPStrategy(debug_collectives=True) to name the first collective that differs; raise "
            f"DDPStrategy(stall_timeout=...) if a rank is legitimately busy that long.", self.rank)
        if LEDGER.end_stage is not None:  # this process lives on: its stage fails instead
            print(message, file=sys.stderr, flush=True)
            self._stop.set()
            LEDGER.end_stage(message)
            return
        record_failure(HangDetectedError(message))
        os._exit(HANG_EXIT_CODE)  # the main thread is blocked inside the backend and cannot be woken

    # ------------------------------------------------------------------ debug fingerprints
    def verify_fingerprint(self, seq: int, fingerprint: str) -> None:
        """Compare this collective with every rank's at the same sequence number; raise on the first
        difference. A rank that never gets there is the watchdog's business (the wait is bounded)."""
        self.store.set(f"fp/{seq}/{self.rank}", fingerprint)
        keys = [f"fp/{seq}/{rank}" for rank in range(self.world_size)]
        deadline = time.monotonic() + self.stall_timeout
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                missing = [rank for rank, key in enumerate(keys) if not self.store.check([key])]
                raise CollectiveMismatchError(rank_prefixed_message(
                    f"collective #{seq} ({fingerprint}) was not reached by rank(s) {missing} within "
                    f"{self.stall_timeout:.0f} s (stall_timeout).", self.rank))
            time.sleep(0.001)
        prints = [value.decode() for value in self.store.multi_get(keys)]
        if seq > 1:  # every rank has published seq, so all are past reading seq - 1
            self.store.delete_key(f"fp/{seq - 1}/{self.rank}")
        reference = prints[0]
        for rank, other in enumerate(prints):
            if _without_site(other) != _without_site(reference):
                raise CollectiveMismatchError(rank_prefixed_message(
                    f"collective #{seq} differs between ranks: rank 0 issues {reference}, rank {rank} issues "
                    f"{other}. Every rank must issue the same collectives in the same order.", self.rank))


class HangDetectedError(RuntimeError):
    """The hang guard found ranks that cannot meet; the message names them and their call sites."""


def _fingerprint(op: str, tensors: tuple[torch.Tensor, ...]) -> str:
    shapes = ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors)
    return f"{op}[{shapes}] at {main_thread_site()}"


def _without_site(fingerprint: str) -> str:
    return fingerprint.split(" at ", 1)[0]  # ranks may legitimately call from different lines


def main_thread_site() -> str:
    """Where the main thread is: the innermost frame of user code, and of ours (the Trainer's
    before the strategy's) inside it. Bootstrap frames (`<string>`, spawn) say nothing."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    found: dict[str, str] = {}
    while frame is not None and "user" not in found:
        kind = _frame_kind(frame.f_code.co_filename)
        if kind and kind not in found:
            found[kind] = f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    user, ours = found.get("user"), found.get("trainer") or found.get("strategies")
    if user and ours:
        return f"{user} (inside {ours})"
    return user or ours or "unknown"


@functools.lru_cache(maxsize=4096)
def _frame_kind(filename: str) -> str | None:
    """"user", "trainer", "strategies", or None for frames that locate nothing (libraries, this file)."""
    if filename.startswith("<"):
        return None
    path = os.path.realpath(filename)
    if path == os.path.realpath(__file__):
        return None
    for root in _OUR_ROOTS:  # before the libraries: an installed wheel puts us in site-packages
        if path.startswith(root + os.sep):
            return os.path.basename(root)
    return None if path.startswith(_LIBRARY_ROOTS) else "user"


def _short(filename: str) -> str:
    path = os.path.realpath(filename)
    for root in _OUR_ROOTS:
        if path.startswith(root + os.sep):
            return str(Path(path).relative_to(Path(root).parent))
    with contextlib.suppress(ValueError):
        return str(Path(path).relative_to(Path.cwd()))
    return path


def record_failure(error: BaseException) -> None:
    """Print the error and leave it where launchers look: our launcher's stamp (the earliest wins)
    and torch elastic's error file (torchrun's summary)."""
    text = "".join(traceback.format_exception_only(type(error), error))
    print(text, file=sys.stderr, flush=True)
    failures_dir = os.environ.get(FAILURES_DIR_VARIABLE)
    if failures_dir:
        write_failure_stamp(Path(failures_dir), text)
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    try:
        raise error
    except BaseException as raised:  # noqa: BLE001 - only to give record_exception a traceback
        with contextlib.suppress(Exception):
            ErrorHandler().record_exception(raised)


def write_failure_stamp(failures_dir: Path, text: str, rank: int | None = None) -> None:
    """One rank's failure with a precise time: the peers' errors it causes come later, so the
    first stamp of a rank is kept (a later error of the same rank is a consequence). The stamp appears
    whole or not at all (written aside, then renamed): rank 0 reads the stamps as soon as one `*.json`
    exists and kills the workers, so a stamp written in place could be read, or left, empty."""
    path = Path(failures_dir, f"{os.environ.get('RANK', '0') if rank is None else rank}.json")
    if path.exists():
        return
    stamp = {"time_ns": time.time_ns(), "traceback": text}
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(stamp))
    os.replace(partial, path)
