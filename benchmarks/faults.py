"""Fault injection: kill, crash, stall or desynchronise a random rank at a random step, many
times, and report.

    python -m benchmarks.faults --trials 8 [--seed 0] [--out benchmarks/results/faults.json]
    python -m benchmarks.faults --scenario preempt --trials 8 [--seed 0]
    python -m benchmarks.faults --scenario savekill --trials 8 [--seed 0]
    python -m benchmarks.faults --scenario savekill --zero-stage 1 [--async-checkpoint]  # the same, other engines

Each trial's job runs in a process of its own (benchmarks/fault_job.py), which is global rank 0 of a
2-process fit with our Trainer and DDPStrategy, as a user's script is; rank 1 is its worker. A fault
on rank 0 therefore hits that job, never this harness, which watches the job from outside: when its
last process ended, whether it hung, which of its processes were left behind (every process of the
job's session, the worker and its forkserver included, however they were reparented), and which
weights it ended with. Every fault fires once per trial (a stamp file, not the restart count, says
whether it fired), so a restarted group or a requeued job runs clean.

`--scenario crash`: one rank fails at a random step in one of four ways: SIGKILL (`kill`), an
exception (`raise`), stuck in its own code for 10 minutes (`stall`: only the hang guard can end that
early), or skipping the step (`skip`: `training_step` returns None on that rank alone, so it issues
one gradient all-reduce fewer than its peer). Every mode hits rank 0 and rank 1 alike often (8 trials:
each mode on each rank; any 2 consecutive trials: both ranks). Each fault runs twice:

* no restarts: the job must fail. We record how long after the fault the job's last process had
  ended, whether it hung (no end within 60 s), and whether any process was left.
* `DDPStrategy(max_restarts=1)` with a checkpoint every 2 steps: the group restarts, resumes from the
  newest checkpoint by itself, and must end with the same weights as an uninterrupted run, bit for
  bit. A fault that ends rank 0 itself (SIGKILL, or its own exception, which the strategy passes on
  and does not restart: `raise`, and `skip`, whose error rank 0 raises) ends the job: the harness
  then requeues it as a scheduler would (`fit(ckpt_path="last")` in a new process), and the requeued
  job must end bit-identical. Every rank must have seen the same
  restart count in each attempt (`TORCHELASTIC_RESTART_COUNT` as user code reads it, and
  `strategy.restart_count`).

`--scenario preempt`: a preemption notice (SIGTERM or SIGUSR1) goes at a random step to rank 0,
rank 1, every rank, or the job's process from outside (this harness, as a scheduler does, once rank 0
began that step). The job must exit with code 75 (`Preempted`) leaving one loadable preemption
checkpoint; a second job in the same directory resumes from it and must end bit-identical to the
uninterrupted run. Work lost = steps begun on any rank that the checkpoint does not hold.

`--scenario savekill`: rank 0 is SIGKILLed while it writes a checkpoint (a random save, after a random
number of bytes): the job dies with it, and its worker must end by itself. Every checkpoint file left
must load, and the requeued job resumes from the newest one and must end bit-identical.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

from benchmarks.fault_job import MODES, STEPS, JobSpec, notice_of
from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO
from strategies.preemption import PREEMPTED_EXIT_CODE

HANG_AFTER_S = 60.0  # the hang guard's stall_timeout is 25 s; the process-group timeout 10 min
JOB_LIMIT_S = 300.0  # a job without a fault (or before it) that runs this long hangs too
# After the job's process ended, how long its worker may take to end by itself (a worker whose
# launcher died is interrupted at once and ends itself after a 10 s grace) before it counts as left.
LEFTOVER_AFTER_S = 15.0
_REPO = Path(__file__).resolve().parents[1]


@dataclass
class JobRun:
    """What the harness saw of one job process and the processes it started."""

    returncode: int | None = None
    hung: bool = False
    seconds: float = 0.0  # from the job's start to the end of its last process
    ended_after_fault_s: float | None = None  # from the fault to the end of the job's last process
    leftover_processes: int = 0
    exception: str = ""
    error: str = ""
    notice_sent_at_step: int | None = None
    ended_at: float = 0.0  # epoch seconds


def run_job(spec: JobSpec, notice: tuple[int, int] | None = None) -> JobRun:
    """Run one job (benchmarks/fault_job.py) in a new session and watch it until every process of it
    has ended. `notice` = (step, signal): send `signal` to the job's process once rank 0 began `step`."""
    run = JobRun()
    log = Path(spec.workdir, "jobs.log").open("a")
    env = dict(os.environ, TMPDIR=str(Path(spec.workdir, "tmp")), PYTHONPATH=f"{_REPO}{os.pathsep}"
               f"{os.environ.get('PYTHONPATH', '')}")
    Path(env["TMPDIR"]).mkdir(exist_ok=True)
    started = time.time()
    job = subprocess.Popen([sys.executable, "-m", "benchmarks.fault_job", json.dumps(asdict(spec))], cwd=_REPO,
                           env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    with log:
        while job.poll() is None:
            if notice is not None and run.notice_sent_at_step is None:
                run.notice_sent_at_step = _send_notice(job.pid, spec, *notice)
            if _overdue(spec, started):
                run.hung = True
                _kill_session(job.pid)
            time.sleep(0.02)
        run.returncode = job.returncode
        left = _wait_for_session_end(job.pid, LEFTOVER_AFTER_S)
        run.leftover_processes = len(left)
        _kill_session(job.pid)  # so a straggler cannot disturb the next trial
    run.ended_at = ended = time.time()
    run.seconds = round(ended - started, 2)
    if spec.path("failed_at").exists() and (fault := float(spec.path("failed_at").read_text())) >= started:
        run.ended_after_fault_s = round(ended - fault, 2)
    _read_result(spec, run)
    return run


def _send_notice(pid: int, spec: JobSpec, step: int, number: int) -> int | None:
    """Signal the job's process once rank 0 began `step` or a later one; the step it was at, or None."""
    try:
        begun = int(spec.path("step.rank0").read_text())
    except (OSError, ValueError):
        return None
    if begun < step:
        return None
    spec.path("failed_at").write_text(str(time.time()))
    os.kill(pid, number)
    return begun


def _overdue(spec: JobSpec, started: float) -> bool:
    """Hung: a job without restarts that has not ended HANG_AFTER_S after its fault (a requeued job's
    stamp is its predecessor's), or any job JOB_LIMIT_S after its start (a restarted one runs the
    hang guard's detection, a new group's start and the rest of the fit after its fault)."""
    now = time.time()
    try:
        fault = float(spec.path("failed_at").read_text())
    except (OSError, ValueError):
        fault = None
    if spec.max_restarts == 0 and fault is not None and fault >= started and now - fault > HANG_AFTER_S:
        return True
    return now - started > JOB_LIMIT_S


def session_members(session: int) -> list[int]:
    """The live processes of `session` (the job's, started with start_new_session: its worker and
    forkserver stay in it even after they are reparented); zombies are dead already."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == session:
            members.append(int(entry.name))
    return members


def _wait_for_session_end(session: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := session_members(session)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _kill_session(session: int) -> None:
    """SIGKILL the job's processes, one by one (they are this harness's job and what it started)."""
    for pid in session_members(session):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read_result(spec: JobSpec, run: JobRun) -> None:
    try:
        result = json.loads(spec.path("result.json").read_text())
        spec.path("result.json").unlink()  # a requeued job writes its own
    except (OSError, ValueError):
        code = run.returncode or 0
        signal_name = f"killed by {signal.Signals(-code).name}" if code < 0 else ""
        run.error = signal_name or f"exit {run.returncode} without a result"
        return
    run.exception = result["exception"]
    run.error = result["error"].splitlines()[0][:200] if result["error"] else ""


def same_weights(spec: JobSpec, reference: dict[str, torch.Tensor]) -> bool:
    """Whether the job's final weights equal the uninterrupted run's, bit for bit."""
    path = spec.path("final.pt")
    if not path.exists():
        return False
    final = torch.load(path, weights_only=True)
    return final.keys() == reference.keys() and all(torch.equal(v, final[k]) for k, v in reference.items())


def restart_counts(spec: JobSpec) -> dict[str, list[str]]:
    """What each rank saw at each attempt's start: `<environment>/<strategy.restart_count>`."""
    return {path.name.removeprefix("attempts."): path.read_text().split()
            for path in sorted(Path(spec.workdir).glob("attempts.rank*"))}


def counts_agree(seen: dict[str, list[str]]) -> bool:
    """Every rank saw the same attempts, and in each the environment and the strategy agree."""
    attempts = list(seen.values())
    same = len(attempts) > 1 and all(a == attempts[0] for a in attempts)
    return same and all(len(set(line.split("/"))) == 1 for line in attempts[0])


@dataclass
class Trial:
    scenario: str
    rank: int
    step: int
    mode: str
    exit_code: int | None = None
    ended_after_s: float | None = None
    hung: bool = False
    leftover_processes: int = 0
    restarted_by: str | None = None  # "strategy" (max_restarts) or "requeue" (a new job: rank 0 itself ended)
    resumed_exactly: bool | None = None
    restart_counts_seen: dict[str, list[str]] = field(default_factory=dict)
    restart_counts_agree: bool | None = None
    error: str = ""


_ENGINE: dict[str, Any] = {}  # the run's DDPStrategy options (--zero-stage, --async-checkpoint), set by main


def _job(workdir: str, *args: Any, **kwargs: Any) -> JobSpec:
    """A job of this run: every job, the reference and the requeued ones too, trains with the same engine
    options, so a fault trial is compared with an uninterrupted run of the same configuration."""
    return JobSpec(workdir, *args, **kwargs, **_ENGINE)


def run_trial(scenario: str, rank: int, step: int, mode: str, reference: dict[str, torch.Tensor]) -> Trial:
    trial = Trial(scenario, rank, step, mode)
    with TemporaryDirectory(prefix="faults-") as tmp:
        restarting = scenario == "restart"
        spec = _job(tmp, rank, step, mode, max_restarts=1 if restarting else 0)
        job = run_job(spec)
        trial.exit_code, trial.hung, trial.leftover_processes = job.returncode, job.hung, job.leftover_processes
        trial.ended_after_s = None if restarting else job.ended_after_fault_s
        trial.error = job.error
        if not restarting:
            return trial
        seen = restart_counts(spec)
        in_job_restart = any(len(lines) > 1 for lines in seen.values())
        trial.restarted_by = "strategy" if in_job_restart else None
        if in_job_restart:
            trial.restart_counts_seen, trial.restart_counts_agree = seen, counts_agree(seen)
        # The fault ended rank 0 itself: killed, or its own exception (which the strategy passes on, never
        # restarts: a raise, or the skip's error), not a worker failure.
        rank0_ended = rank == 0 and job.returncode != 0 and job.exception != "WorkerFailedError"
        if rank0_ended and not job.hung:
            requeued = run_job(_job(tmp, rank, step, mode, max_restarts=1, resume=True))
            trial.restarted_by, trial.error = "requeue", requeued.error
            trial.hung, trial.leftover_processes = requeued.hung, job.leftover_processes + requeued.leftover_processes
        trial.resumed_exactly = same_weights(spec, reference)
    return trial


@dataclass
class NoticeTrial:
    target: str
    signal: str
    notice_step: int
    exit_code: int | None = None
    stopped_after: int | None = None  # steps the preemption checkpoint holds
    lost_steps: int | None = None  # steps begun on some rank that the checkpoint does not hold
    seconds_to_exit: float | None = None
    checkpoint_loads: bool = False
    resumed_exactly: bool = False
    hung: bool = False
    leftover_processes: int = 0
    error: str = ""


def run_notice_trial(target_code: int, step: int, reference: dict[str, torch.Tensor]) -> NoticeTrial:
    target, number = notice_of(target_code)
    trial = NoticeTrial(target, number.name, step)
    with TemporaryDirectory(prefix="faults-") as tmp:
        spec = _job(tmp, target_code, step, "preempt")
        job = run_job(spec, notice=(step, number) if target == "outside" else None)
        if job.notice_sent_at_step is not None:
            trial.notice_step = job.notice_sent_at_step
        trial.exit_code, trial.seconds_to_exit, trial.hung = job.returncode, job.seconds, job.hung
        trial.error = "" if job.returncode == PREEMPTED_EXIT_CODE else job.error or "not preempted"
        try:
            trial.stopped_after = int(TorchCheckpointIO().load(Path(tmp, "preempted.ckpt"))["global_step"])
            trial.checkpoint_loads = True
        except CheckpointError as error:
            trial.error = trial.error or str(error)[:160]
        begun = [int(spec.path(f"step.rank{rank}").read_text()) + 1 for rank in range(2)]
        trial.lost_steps = max(begun) - trial.stopped_after if trial.stopped_after is not None else None
        resumed = run_job(_job(tmp))  # no notice: the same directory, resumed from the preemption checkpoint
        trial.error = trial.error or (f"resume: {resumed.error}" if resumed.returncode else "")
        trial.resumed_exactly = same_weights(spec, reference)
        trial.hung = trial.hung or resumed.hung
        trial.leftover_processes = job.leftover_processes + resumed.leftover_processes
    return trial


@dataclass
class SaveKillTrial:
    save_index: int
    after_bytes: int
    killed: bool = False
    exit_code: int | None = None
    worker_ended_after_s: float | None = None  # from the kill to the end of the job's last process
    files_left: int = 0
    corrupt_files: int = 0
    resumed_exactly: bool = False
    hung: bool = False
    leftover_processes: int = 0
    error: str = ""


def run_savekill_trial(save_index: int, after_bytes: int, reference: dict[str, torch.Tensor]) -> SaveKillTrial:
    trial = SaveKillTrial(save_index, after_bytes)
    with TemporaryDirectory(prefix="faults-") as tmp:
        spec = _job(tmp, max_restarts=1, save_index=save_index, after_bytes=after_bytes)
        job = run_job(spec)
        trial.exit_code, trial.hung = job.returncode, job.hung
        trial.killed = spec.path("killed").exists()
        if trial.killed:
            trial.worker_ended_after_s = round(job.ended_at - float(spec.path("killed").read_text()), 2)
        files = sorted(spec.path("ckpts").glob("*.ckpt"))
        trial.files_left = len(files)
        for file in files:
            try:
                TorchCheckpointIO().load(file)
            except CheckpointError:
                trial.corrupt_files += 1
        requeued = run_job(_job(tmp, max_restarts=1, resume=True, save_index=save_index, after_bytes=after_bytes))
        trial.error = "" if trial.killed else "no kill during a save"
        trial.error = trial.error or (requeued.error if requeued.returncode else "")
        trial.resumed_exactly = same_weights(spec, reference)
        trial.hung = trial.hung or requeued.hung
        trial.leftover_processes = job.leftover_processes + requeued.leftover_processes
    return trial


def _reference() -> dict[str, torch.Tensor]:
    """The uninterrupted run's weights, from a job like every other."""
    with TemporaryDirectory(prefix="faults-") as tmp:
        job = run_job(_job(tmp))
        if job.returncode != 0:
            raise RuntimeError(f"the uninterrupted reference job failed: {job.error}")
        return dict(torch.load(Path(tmp, "final.pt"), weights_only=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("crash", "preempt", "savekill"), default="crash")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2), default=0, help="DDPStrategy(zero_stage=...)")
    parser.add_argument("--async-checkpoint", action="store_true", help="DDPStrategy(async_checkpoint=True)")
    parser.add_argument("--out", default=None,
                        help="default: benchmarks/results/faults[_SCENARIO][_zeroN][_async].json")
    args = parser.parse_args()
    _ENGINE.update(zero_stage=args.zero_stage, async_checkpoint=args.async_checkpoint)
    suffix = ("" if args.scenario == "crash" else "_" + args.scenario) + \
        (f"_zero{args.zero_stage}" if args.zero_stage else "") + ("_async" if args.async_checkpoint else "")
    out = args.out or f"benchmarks/results/faults{suffix}.json"
    chooser = random.Random(args.seed)
    reference = _reference()
    run = {"crash": _crash_trials, "preempt": _notice_trials, "savekill": _savekill_trials}[args.scenario]
    trials, report = run(args.trials, chooser, reference)
    report = {"seed": args.seed, "engine": dict(_ENGINE), "load_before": _load(), **report}
    _write(Path(out), report, trials)


def _load() -> str:
    return Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else ""


def _crash_trials(count: int, chooser: random.Random, reference: dict[str, torch.Tensor]) -> tuple[list[Any], Any]:
    trials, first_rank = [], chooser.randrange(2)
    for trial in range(count):
        # Every mode alike often; the rank alternates, and flips its phase every len(MODES) trials, so any
        # run has faults on both ranks and 8 trials have each mode on each rank.
        mode = MODES[trial % len(MODES)]
        rank, step = (first_rank + trial + trial // len(MODES)) % 2, chooser.randrange(1, STEPS)
        for scenario in ("no_restart", "restart"):
            trials.append(run_trial(scenario, rank, step, mode, reference))
            print(json.dumps(asdict(trials[-1])), flush=True)
    return trials, summarize(trials)


def _notice_trials(count: int, chooser: random.Random, reference: dict[str, torch.Tensor]) -> tuple[list[Any], Any]:
    trials = []
    for trial in range(count):  # every target and signal alike often; a step with at least one after it
        trials.append(run_notice_trial(trial % 8, chooser.randrange(0, STEPS - 2), reference))
        print(json.dumps(asdict(trials[-1])), flush=True)
    return trials, summarize_notices(trials)


def _savekill_trials(count: int, chooser: random.Random, reference: dict[str, torch.Tensor]) -> tuple[list[Any], Any]:
    trials = []
    for _ in range(count):  # saves come every 2 steps, each writes 2 files (top-k, last) of ~114 KiB: 24 in a fit
        trials.append(run_savekill_trial(chooser.randrange(1, STEPS), chooser.randrange(1, 110_000), reference))
        print(json.dumps(asdict(trials[-1])), flush=True)
    return trials, summarize_savekills(trials)


def summarize(trials: list[Trial]) -> dict[str, Any]:
    failing = [t for t in trials if t.scenario == "no_restart"]
    restarted = [t for t in trials if t.scenario == "restart"]
    by_strategy = [t for t in restarted if t.restarted_by == "strategy"]
    seconds = [t.ended_after_s for t in failing if t.ended_after_s is not None]
    return {
        "trials": len(failing),
        "faults_on_rank0": sum(t.rank == 0 for t in failing),
        "hangs": sum(t.hung for t in trials),
        "failed_runs_reported": sum(t.exit_code not in (0, None) for t in failing),
        "seconds_to_exit_median": round(statistics.median(seconds), 2) if seconds else None,
        "seconds_to_exit_max": max(seconds) if seconds else None,
        "seconds_to_exit_by_mode_and_rank": {f"{mode}/rank{rank}": max(
            (t.ended_after_s for t in failing if t.mode == mode and t.rank == rank and t.ended_after_s is not None),
            default=None) for mode in MODES for rank in (0, 1)},
        "restarts_resumed_exactly": f"{sum(bool(t.resumed_exactly) for t in restarted)}/{len(restarted)}",
        "restarted_by_strategy": len(by_strategy),
        "requeued_after_rank0_ended": sum(t.restarted_by == "requeue" for t in restarted),
        "restart_counts_agree": f"{sum(bool(t.restart_counts_agree) for t in by_strategy)}/{len(by_strategy)}",
        "leftover_processes": sum(t.leftover_processes for t in trials),
    }


def summarize_notices(trials: list[NoticeTrial]) -> dict[str, Any]:
    delays = [t.stopped_after - t.notice_step for t in trials if t.stopped_after is not None]
    return {
        "trials": len(trials), "hangs": sum(t.hung for t in trials),
        "exit_code_75": f"{sum(t.exit_code == PREEMPTED_EXIT_CODE for t in trials)}/{len(trials)}",
        "checkpoints_missing_or_corrupt": sum(not t.checkpoint_loads for t in trials),
        "resumed_exactly": f"{sum(t.resumed_exactly for t in trials)}/{len(trials)}",
        "lost_steps_max": max((t.lost_steps for t in trials if t.lost_steps is not None), default=None),
        "notice_to_stop_steps_max": max(delays, default=None),
        "seconds_to_exit_max": max((t.seconds_to_exit or 0.0) for t in trials),
        "leftover_processes": sum(t.leftover_processes for t in trials),
        "errors": [t.error for t in trials if t.error],
    }


def summarize_savekills(trials: list[SaveKillTrial]) -> dict[str, Any]:
    ended = [t.worker_ended_after_s for t in trials if t.worker_ended_after_s is not None]
    return {
        "trials": len(trials), "hangs": sum(t.hung for t in trials),
        "killed_during_a_save": f"{sum(t.killed for t in trials)}/{len(trials)}",
        "job_killed_with_rank0": f"{sum(t.exit_code == -signal.SIGKILL for t in trials)}/{len(trials)}",
        "worker_ended_after_s_max": max(ended, default=None),
        "corrupt_checkpoint_files": sum(t.corrupt_files for t in trials),
        "trials_left_without_a_checkpoint": sum(t.files_left == 0 for t in trials),
        "resumed_exactly": f"{sum(t.resumed_exactly for t in trials)}/{len(trials)}",
        "leftover_processes": sum(t.leftover_processes for t in trials),
        "errors": [t.error for t in trials if t.error],
    }


def _write(out: Path, report: dict[str, Any], trials: list[Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": report, "trials": [asdict(t) for t in trials]}, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
