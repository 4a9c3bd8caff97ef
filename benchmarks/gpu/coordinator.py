"""Run the contenders' processes in turns, phase by phase, inside a time budget.

A phase is one workload in one mode (eager or compiled). In a phase every contender warms up
(its compile included; several at once, since warm-up is not timed), then the contenders take
turns: one unmeasured settling round, then `rounds` measured rounds, the order rotated each round,
so a slow minute of the machine falls on every contender alike. Each contender's measured stretch is
at least 300 steps or 10 s (`measure_target_s`), shortened only when the budget cannot hold it (the
results then say so). Then each gives its host time per step and a profiled stretch, and ends.
Results are written after every phase, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).parents[2]
PROTOCOL_TIMEOUT_S = 120.0  # a command that answers nothing for this long (beyond its own length) failed
MIN_PHASE_S = 20.0  # a phase that cannot get this much of the budget is skipped, not half-run


class ContenderLost(RuntimeError):
    """The contender's process died, or did not answer in time; its message says which."""


@dataclass
class Settings:
    accelerator: str
    precision: str
    smoke: bool
    rounds: int
    budget_s: float
    min_steps: int = 300
    min_s: float = 3.0
    max_s: float = 10.0  # "at least 300 steps or 10 s": whichever comes first, but never under min_s
    window_s: float = 0.25
    max_settle_s: float = 5.0  # alone on the device, until steady or this long, before the plan is made
    max_warmup_s: float = 300.0  # compiles included
    parallel_warmups: int = 3  # compiles are single-threaded Python and overlap well; activations bound the number
    host_steps: int = 10
    profile_steps: int = 5


@dataclass
class Contender:
    """One persistent contender process and the messages its reader thread has seen."""

    name: str
    loop: str
    settings: Settings
    log: IO[str]
    process: subprocess.Popen | None = None
    inbox: queue.Queue = field(default_factory=queue.Queue)

    def spawn(self) -> None:
        """Start the process; `await_alive` then waits until its imports are done."""
        command = [sys.executable, "-m", "benchmarks.gpu.worker", "--loop", self.loop,
                   "--accelerator", self.settings.accelerator, "--precision", self.settings.precision]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore")}
        self.process = subprocess.Popen([*command, *(["--smoke"] if self.settings.smoke else [])], cwd=REPO, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.inbox = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stdout, self.inbox), daemon=True).start()

    def await_alive(self) -> None:
        self.receive(PROTOCOL_TIMEOUT_S)  # {"alive": ...}

    @staticmethod
    def _read(stream: IO[str], inbox: queue.Queue) -> None:
        for line in stream:
            inbox.put(json.loads(line))
        inbox.put(None)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send(self, command: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise ContenderLost(f"{self.name}: its process is gone ({error})") from error

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            message = self.inbox.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise ContenderLost(f"{self.name}: no answer in {timeout:.0f} s; its process was stopped") from None
        if message is None:
            code = self.process.wait() if self.process is not None else None
            raise ContenderLost(f"{self.name}: its process exited (code {code}); see the log")
        return message

    def ask(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(command)
        return self.receive(timeout)

    def stop(self) -> None:
        if self.alive:
            assert self.process is not None
            self.process.kill()
            self.process.wait()


class Phase:
    """One workload in one mode: warm-ups, rounds, probes, ends; `record` is what it found."""

    def __init__(self, contenders: list[Contender], workload: str, mode: str, settings: Settings,
                 seconds_available: float) -> None:
        self.contenders, self.workload, self.mode, self.settings = contenders, workload, mode, settings
        self.deadline = time.monotonic() + seconds_available
        self.record: dict[str, Any] = {"workload": workload, "mode": mode,
                                       "contenders": {contender.name: {} for contender in contenders}}
        self.failed: dict[str, str] = {}

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        ready = self._warm_up()
        if ready:
            settled = self._settle(ready)
            self._rounds(self._measurement_plan(settled))
            self._probes()
        self._end()
        self.record["errors"] = self.failed
        self.record["phase_s"] = time.monotonic() - started
        return self.record

    # ------------------------------------------------------------------ steps of a phase
    def _warm_up(self) -> dict[str, dict[str, Any]]:
        """Start every contender's stretch, at most `parallel_warmups` warming at once."""
        command = {"cmd": "start", "workload": self.workload, "mode": self.mode}
        waiting = [c for c in self.contenders if c.alive]
        warming: dict[str, float] = {}  # name -> when its warm-up began
        ready: dict[str, dict[str, Any]] = {}
        while waiting or warming:
            while waiting and len(warming) < self.settings.parallel_warmups:
                contender = waiting.pop(0)
                if self._attempt(contender, lambda c=contender: c.send(command)):
                    warming[contender.name] = time.monotonic()
            for contender in [c for c in self.contenders if c.name in warming]:
                answer = self._poll(contender, warming[contender.name])
                if answer is not None:
                    del warming[contender.name]
                    if answer.get("ready"):
                        ready[contender.name] = answer
                        self._entry(contender)["warmup"] = answer
            time.sleep(0.01)
        return ready

    def _poll(self, contender: Contender, began: float) -> dict[str, Any] | None:
        """The contender's next answer if it has one; a failure is recorded and counts as an answer."""
        try:
            message = contender.inbox.get_nowait()
        except queue.Empty:
            if time.monotonic() - began > self.settings.max_warmup_s:
                contender.stop()
                self._fail(contender, f"warm-up did not end in {self.settings.max_warmup_s:.0f} s")
                return {}
            return None
        if message is None:
            self._fail(contender, f"its process exited (code {contender.process.wait() if contender.process else '?'})")
            return {}
        if "error" in message:
            self._fail(contender, message["error"])
        return message

    def _settle(self, ready: dict[str, dict[str, Any]]) -> dict[str, float]:
        """Each in turn, alone on the device, runs until its step time is steady: the step time every
        plan is built on (warm-ups overlap, so their own step times are not clean)."""
        settled = {}
        for contender in self.contenders:
            if contender.name not in ready or contender.name in self.failed:
                continue
            window = self._window(ready[contender.name]["step_ms"])
            answer = self._ask(contender, {"cmd": "settle", "window": window,
                                           "max_s": self.settings.max_settle_s},
                               PROTOCOL_TIMEOUT_S + 3 * self.settings.max_settle_s)
            if answer is not None:
                settled[contender.name] = float(answer["step_ms"])
                self._entry(contender)["settle"] = answer
        return settled

    def _measurement_plan(self, step_ms: dict[str, float]) -> dict[str, tuple[int, int, float]]:
        """(windows per round, steps per window, expected seconds) per contender: each measures at
        least `min_steps` steps or `max_s` seconds (never under `min_s`), scaled down only to fit the
        time left (the record says by how much)."""
        settings = self.settings
        targets = {name: min(settings.max_s, max(settings.min_s, settings.min_steps * ms / 1e3))
                   for name, ms in step_ms.items()}
        probe_s = sum((settings.host_steps + settings.profile_steps) * ms / 1e3 * 3 for ms in step_ms.values())
        room = self.deadline - time.monotonic() - probe_s
        needed = sum(targets.values())
        scale = min(1.0, max(0.1, room / needed)) if needed > 0 else 1.0
        plan = {}
        for name, ms in step_ms.items():
            window = self._window(ms)
            windows = max(2, math.ceil(targets[name] * scale * 1e3 / ms / (settings.rounds * window)))
            plan[name] = (windows, window, windows * window * ms / 1e3)
            self._entry_by_name(name)["plan"] = {"windows_per_round": windows, "window_steps": window,
                                                 "target_s": targets[name], "scale": round(scale, 3)}
        return plan

    def _window(self, step_ms: float) -> int:
        """Steps per timed window: about `window_s` of work, so event resolution never matters."""
        return max(3, min(1000, math.ceil(self.settings.window_s * 1e3 / max(step_ms, 1e-3))))

    def _rounds(self, plan: dict[str, tuple[int, int, float]]) -> None:
        order = [c for c in self.contenders if c.name in plan]
        for round_index in range(self.settings.rounds):
            shift = round_index % max(1, len(order))
            for contender in order[shift:] + order[:shift]:
                if contender.name in self.failed:
                    continue
                windows, window, expected_s = plan[contender.name]
                answer = self._ask(contender, {"cmd": "round", "windows": windows, "window": window},
                                   PROTOCOL_TIMEOUT_S + 10 * expected_s)
                if answer is not None:
                    self._entry(contender).setdefault("rounds", []).append({"position": (order.index(contender)
                                                                                         - shift) % len(order),
                                                                            **answer})

    def _probes(self) -> None:
        for contender in self.contenders:
            if contender.name in self.failed or "rounds" not in self._entry(contender):
                continue
            for command, steps in (("host", self.settings.host_steps), ("profile", self.settings.profile_steps)):
                answer = self._ask(contender, {"cmd": command, "steps": steps}, PROTOCOL_TIMEOUT_S)
                if answer is not None:
                    self._entry(contender)[command] = answer

    def _end(self) -> None:
        for contender in self.contenders:
            if contender.name in self.failed or not contender.alive or "warmup" not in self._entry(contender):
                continue
            answer = self._ask(contender, {"cmd": "end"}, PROTOCOL_TIMEOUT_S)
            if answer is not None:
                self._entry(contender)["end"] = answer

    # ------------------------------------------------------------------ bookkeeping
    def _ask(self, contender: Contender, command: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        answer: dict[str, Any] = {}

        def exchange() -> None:
            answer.update(contender.ask(command, timeout))

        if not self._attempt(contender, exchange):
            return None
        if "error" in answer:
            self._fail(contender, answer["error"])
            return None
        return answer

    def _attempt(self, contender: Contender, action: Any) -> bool:
        try:
            action()
            return True
        except ContenderLost as lost:
            self._fail(contender, str(lost))
            return False

    def _fail(self, contender: Contender, reason: str) -> None:
        self.failed[contender.name] = reason
        print(f"  {self.workload}/{self.mode}: {contender.name} failed: {reason.strip().splitlines()[-1]}",
              flush=True)

    def _entry(self, contender: Contender) -> dict[str, Any]:
        return self._entry_by_name(contender.name)

    def _entry_by_name(self, name: str) -> dict[str, Any]:
        return self.record["contenders"].setdefault(name, {})


def run_phases(contender_loops: dict[str, str], phases: list[tuple[str, str]], settings: Settings,
               log_path: Path, on_phase: Any) -> list[dict[str, Any]]:
    """Start the contender processes, run every phase the budget allows, and stop them."""
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    with log_path.open("w") as log:
        contenders = [Contender(name, loop, settings, log) for name, loop in contender_loops.items()]
        try:
            for index, (workload, mode) in enumerate(phases):
                left = settings.budget_s - (time.monotonic() - started)
                share = left * _weight(mode) / sum(_weight(later) for _, later in phases[index:])
                if left < MIN_PHASE_S:
                    records.append({"workload": workload, "mode": mode, "skipped": "the time budget was spent"})
                    on_phase(records)
                    continue
                _revive(contenders)
                print(f"phase {workload}/{mode} ({left:.0f} s of budget left)", flush=True)
                records.append(Phase(contenders, workload, mode, settings, share).run())
                on_phase(records)
        finally:
            for contender in contenders:
                if contender.alive:
                    _quit(contender)
    return records


def _weight(mode: str) -> float:
    """A compiled phase's share of the budget against an eager one's: its warm-ups are compiles."""
    return 2.0 if mode == "compiled" else 1.0


def _revive(contenders: list[Contender]) -> None:
    """Start every contender whose process is not running (the first phase, or one that died or was
    stopped in the last phase), all at once, then wait until each has imported what it needs."""
    starting = [contender for contender in contenders if not contender.alive]
    for contender in starting:
        contender.spawn()
    for contender in starting:
        try:
            contender.await_alive()
        except ContenderLost as lost:
            print(f"  {contender.name} could not start: {lost}", flush=True)


def _quit(contender: Contender) -> None:
    try:
        contender.send({"cmd": "quit"})
        assert contender.process is not None
        contender.process.wait(timeout=30)
    except (ContenderLost, subprocess.TimeoutExpired):
        contender.stop()
