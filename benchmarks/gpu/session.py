"""Inside one contender's process: time its steps, and pause between stretches of steps so the
contenders take turns on the one GPU.

A training loop (hand-written, Lightning's, ours) calls `Session.step_start()` and
`Session.step_end(loss)` around every optimizer step, and stops when `step_end` returns False. What
happens between those calls is a plan, written as a generator (`Session._plan`): each `yield` lets
the loop run one more step. When the plan needs the coordinator's next command it blocks inside
`step_end`, so a paused contender holds its GPU memory but queues no work, and the loop it runs in
(whoever's it is) never knows.

Timing never stops the device inside a measured stretch: CUDA events are recorded at every step's
start and end and read only after the stretch, with one synchronise. A window's time is from the end
of its previous step to the end of its last step, so it includes whatever the loop does between steps.
The GPU's idle gap between two steps is from one step's end event to the next one's start event:
nonzero only when the host had not yet queued the next step when the device finished the last.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Generator
from typing import IO, Any

import torch

from strategies.telemetry import union_length

FIRST_STEPS = 3  # compiles and first allocations happen here; never timed
RESUME_STEPS = 2  # after a pause: the allocator takes its blocks back, clocks settle; never timed
STEADY_WINDOWS = 3  # warm-up ends when this many windows in a row agree
STEADY_TOLERANCE = 0.03


class Marks:
    """Timestamps on the device's timeline (CUDA events) or, on the CPU, the host clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two marks (after `sync()` for CUDA events)."""
        return float(start.elapsed_time(end)) if self.cuda else 1e3 * (end - start)


class Channel:
    """One JSON object per line: commands in from the coordinator, answers out on the protocol stream."""

    def __init__(self, commands: IO[str], answers: IO[str]) -> None:
        self.commands, self.answers = commands, answers

    def receive(self) -> dict[str, Any]:
        line = self.commands.readline()
        if not line:
            return {"cmd": "quit"}  # the coordinator is gone: stop as if told to
        return json.loads(line)

    def send(self, message: dict[str, Any]) -> None:
        self.answers.write(json.dumps(message) + "\n")
        self.answers.flush()


class Session:
    """Called by a training loop around every step; runs the plan (warm up, rounds, probes, end)."""

    def __init__(self, channel: Channel, device: torch.device) -> None:
        self.channel, self.device, self.marks = channel, device, Marks(device)
        self.created = time.perf_counter()  # the warm-up's clock starts before the first (compiling) step
        self.steps = 0
        self.last_loss: torch.Tensor | None = None
        self.finished = False  # the coordinator ended the stretch of training (not an error)
        self._starts: list[Any] | None = None  # recording start marks while a round runs
        self._plan_steps = self._plan()
        next(self._plan_steps)  # run the plan up to its first step

    # ------------------------------------------------------------------ called by the training loop
    def step_start(self) -> None:
        if self._starts is not None:
            self._starts.append(self.marks.mark())

    def step_end(self, loss: torch.Tensor | None = None) -> bool:
        """After the optimizer step. False: stop training (the coordinator said end)."""
        self.steps += 1
        self.last_loss = loss
        try:
            next(self._plan_steps)
            return True
        except StopIteration:
            self.finished = True
            return False

    # ------------------------------------------------------------------ the plan
    def _plan(self) -> Generator[None, None, None]:
        yield  # the constructor's priming call: the loop has not stepped yet
        ready = yield from self._warm_up()
        self.channel.send(ready)
        handlers = {"settle": self._settle, "round": self._round, "host": self._host_time, "profile": self._profile}
        while True:
            command = self._pause()
            if command["cmd"] not in handlers:
                return  # "end" (or "quit"): the loop stops after this step
            answer = yield from handlers[command["cmd"]](command)
            self.channel.send(answer)

    def _pause(self) -> dict[str, Any]:
        """Wait for the next command holding only what training keeps between steps (weights,
        gradients' buckets, optimizer state): the allocator's cached activation blocks go back to the
        device, so the contender that runs next has the memory a lone training job would have."""
        if self.marks.cuda:
            torch.cuda.empty_cache()
        return self.channel.receive()

    def _warm_up(self) -> Generator[None, None, dict[str, Any]]:
        """The first (compiling) steps and a short probe of the step time. Contenders warm up at the
        same time, so steadiness is judged later, by `_settle`, with the device to itself."""
        for _ in range(FIRST_STEPS - 1):
            yield
        self.marks.sync()
        first_steps_s = time.perf_counter() - self.created
        early_loss = float(self.last_loss.detach()) if self.last_loss is not None else None
        probe_ms = yield from self._timed_steps(3)
        return {"ready": True, "step_ms": probe_ms, "first_steps_s": first_steps_s, "loss_at_first_steps": early_loss}

    def _settle(self, command: dict[str, Any]) -> Generator[None, None, dict[str, Any]]:
        """Windows until STEADY_WINDOWS in a row agree within STEADY_TOLERANCE, or `max_s` is spent."""
        started, window = time.perf_counter(), int(command["window"])
        history: list[float] = []
        while len(history) < STEADY_WINDOWS or (not _steady(history[-STEADY_WINDOWS:])
                                                and time.perf_counter() - started < float(command["max_s"])):
            history.append((yield from self._timed_steps(window)))
        return {"step_ms": statistics.median(history[-STEADY_WINDOWS:]), "steady": _steady(history[-STEADY_WINDOWS:]),
                "windows": len(history), "settle_s": time.perf_counter() - started, "steps_so_far": self.steps}

    def _timed_steps(self, steps: int) -> Generator[None, None, float]:
        """ms per step over the next `steps` steps (synchronises: warm-up only)."""
        start = self.marks.mark()
        for _ in range(steps):
            yield
        end = self.marks.mark()
        self.marks.sync()
        return self.marks.ms(start, end) / steps

    def _round(self, command: dict[str, Any]) -> Generator[None, None, dict[str, Any]]:
        """`windows` windows of `window` steps, timed by device marks, after RESUME_STEPS untimed."""
        windows, window = int(command["windows"]), int(command["window"])
        for _ in range(RESUME_STEPS):
            yield
        ends = [self.marks.mark()]
        self._starts = []
        cpu_started = time.process_time()
        for _ in range(windows * window):
            yield
            ends.append(self.marks.mark())
        host_cpu_s = time.process_time() - cpu_started
        starts, self._starts = self._starts, None
        self.marks.sync()
        window_ms = [self.marks.ms(ends[k * window], ends[(k + 1) * window]) / window for k in range(windows)]
        gaps_ms = [max(0.0, self.marks.ms(end, start)) for end, start in zip(ends, starts)]
        return {"window_ms": window_ms, "gap_ms_median": statistics.median(gaps_ms),
                "gap_ms_mean": statistics.fmean(gaps_ms), "host_cpu_ms": 1e3 * host_cpu_s / (windows * window),
                "steps": windows * window}

    def _host_time(self, command: dict[str, Any]) -> Generator[None, None, dict[str, Any]]:
        """The host's wall time from one step's end to the next's, with the device idle at the start of
        each (synchronised after every step): what the loop costs the host per step when nothing
        makes it wait. A step whose kernels overflow CUDA's launch queue shows device time instead."""
        per_step = []
        self.marks.sync()
        for _ in range(int(command["steps"])):
            resumed = time.perf_counter()
            yield
            per_step.append(1e3 * (time.perf_counter() - resumed))
            self.marks.sync()
        return {"host_ms_median": statistics.median(per_step), "host_ms_min": min(per_step)}

    def _profile(self, command: dict[str, Any]) -> Generator[None, None, dict[str, Any]]:
        """The device's busy time per step: the union of every kernel's and copy's interval in a
        profiled stretch. The measured step time minus this is the device's idle time per step."""
        steps = int(command["steps"])
        if not self.marks.cuda:
            for _ in range(steps):
                yield
            return {"gpu_busy_ms": None, "note": "no device timeline on the CPU"}
        from torch.profiler import ProfilerActivity, profile

        self.marks.sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            for _ in range(steps):
                yield
            self.marks.sync()
        intervals = [(event.time_range.start, event.time_range.end) for event in profiler.events()
                     if _device_work(event)]
        busy_us = union_length(intervals)
        return {"gpu_busy_ms": busy_us / 1e3 / steps if intervals else None, "device_events": len(intervals)}


def _device_work(event: Any) -> bool:
    """A kernel, copy or fill on the device. Not a `record_function` range that the profiler mirrors
    onto the device's timeline (DDP, Lightning and our loop annotate their steps): such a range spans
    the idle time between its kernels, and counting it would call an idle device busy."""
    return (getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
            and not getattr(event, "is_user_annotation", False))


def _steady(windows: list[float]) -> bool:
    if len(windows) < STEADY_WINDOWS:
        return False
    middle = statistics.median(windows)
    return all(abs(value - middle) <= STEADY_TOLERANCE * middle for value in windows)
