"""Fit then test, as almost every Lightning script does (#17, item 6): what `test()` costs after
`fit()` when the workers live across stages, against the code that started new workers for every
stage and against Lightning's `ddp`.

    python -m benchmarks.stages                        # 5 rounds, both workloads, 3 contenders
    python -m benchmarks.stages --repeats 7 --now HEAD # `ours` pinned to HEAD, not the working tree
    python -m benchmarks.stages --repeats 7 --out /tmp/stages
    python -m benchmarks.stages --workloads digits --contenders ours --quick --out /tmp/s   # smoke

Contenders, each a fresh `python -m benchmarks.contenders.stages_job` process tree that calls
`trainer.fit(...)` then `trainer.test(...)` with 2 CPU ranks x 1 thread (gloo), logger,
checkpointing, progress bar and model summary off, no sanity check:

* `ours`: our `Trainer(strategy="ddp")` at this working tree (`--now REV`: at a checkout of REV);
* `ours_before`: the same job against a checkout of `--before` (default d96989a, one launch per
  stage), made with `git worktree add` (and removed again) unless `--before-root` already holds it;
* `pl_ddp`: `pytorch_lightning.Trainer(strategy="ddp")` (re-runs the command for rank 1).

Workloads: `digits` (the CLI's default job: digits MLP, 10 epochs, test on the validation split),
`digits_workers` (the same with `num_workers=2`: DataLoader worker processes start in every rank each
epoch) and `mlp50m` (54.6M parameters, 4 steps and 4 test batches per rank: start-up and moving the model).

Inside each run the launching process times `fit` and the `test` after it; the harness times the
whole script from outside, and after each run looks for processes of its tree still alive.
Rounds are interleaved with the contender order rotated, as in `benchmarks.run`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks.code_roots import packages_of
from benchmarks.contenders.stages_job import RESULT_PREFIX, WORKLOADS
from benchmarks.contenders.stages_parts import CODE_NOTES_ENV, RANKS
from benchmarks.report import _fmt, _stats
from benchmarks.run import _child_env, machine
from strategies.worker import cpu_threads_per_rank

REPO = Path(__file__).parents[1]
RESULTS = Path(__file__).parent / "results" / "stages"
BEFORE = "d96989a"  # the commit before #17: new workers for every stage
CONTENDERS = {"ours": ("ours", "ours now (workers live across stages)"),
              "ours_before": ("ours", "ours before #17 (new workers per stage)"),
              "pl_ddp": ("lightning", "Lightning Trainer, strategy=\"ddp\"")}
WORKLOAD_LABELS = {"digits": "digits (CLI default job: 64→256→10 MLP, 10 epochs, batch 64/rank)",
                   "digits_workers": "digits_workers (the same with DataLoader(num_workers=2) in each rank)",
                   "mlp50m": "mlp50m (1024→4×4096→10 MLP, 54.6M params, 4 steps + 4 test batches/rank)"}
METRICS = (("fit_s", "fit()"), ("test_s", "test() after fit"), ("wall_s", "whole script"),
           ("startup_s", "start → fit()"), ("exit_s", "test() end → exit"),
           ("tree_end_s", "last process of the tree gone"))
# (name, metric, top, bottom): ratio of medians, with the min–max of the same-round ratios.
RATIOS = (("test() after fit: ours now / Lightning", "test_s", "ours", "pl_ddp"),
          ("fit(): ours now / ours before", "fit_s", "ours", "ours_before"),
          ("whole script: ours now / Lightning", "wall_s", "ours", "pl_ddp"),
          ("test() after fit: ours before / Lightning", "test_s", "ours_before", "pl_ddp"),
          ("fit(): ours now / Lightning", "fit_s", "ours", "pl_ddp"))
MARKER_ENV = "BENCH_STAGES_RUN"  # every process of a run's tree inherits it: how leftovers are found
LEFTOVER_GRACE_S = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stages", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--before", default=BEFORE, help="the commit `ours_before` runs (default: %(default)s)")
    parser.add_argument("--before-root", default="/tmp/ddp-before",
                        help="its checkout: made with `git worktree add` and removed at the end if absent")
    parser.add_argument("--now", default=None, metavar="REV",
                        help="run `ours` at a checkout of REV (e.g. HEAD, pinned when the run starts) instead of the "
                             "working tree, which others may edit while the rounds run")
    parser.add_argument("--quick", action="store_true", help="smoke: 1 round, digits for 1 epoch")
    parser.add_argument("--render", action="store_true", help="only rewrite results.md from --out's results.json")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args(argv)
    args.workloads = _names(args.workloads, WORKLOADS, "--workloads")
    args.contenders = _names(args.contenders, CONTENDERS, "--contenders")
    args.repeats = 1 if args.quick else args.repeats
    return args


def _names(text: str, known: Any, flag: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    if not names or any(name not in known for name in names):
        raise SystemExit(f"{flag}: expected a comma-separated subset of {list(known)}, got {text!r}")
    return names


# ---------------------------------------------------------------------- checkouts of other commits
@contextmanager
def checkout(commit: str, root: Path) -> Iterator[Path]:
    """A directory holding only `commit`'s `trainer` and `strategies`, to go first on PYTHONPATH
    (`code_roots.packages_of`)."""
    created = not root.exists()
    if created:
        _git("worktree", "add", "--detach", str(root), commit)
    head = _git("-C", str(root), "rev-parse", "HEAD")
    if head != _git("rev-parse", commit):
        raise SystemExit(f"{root} is at {head[:12]}, not {commit}")
    try:
        with packages_of(root) as shim:
            yield shim
    finally:
        if created:
            _git("worktree", "remove", "--force", str(root))  # --force: only its __pycache__ is untracked


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


# ---------------------------------------------------------------------- one run
def run_job(contender: str, workload: str, timeout: float, code_root: Path | None = None,
            quick: bool = False) -> dict[str, Any]:
    """One fresh process tree: fit then test. Returns its timings, or `error` with the output's tail."""
    framework = CONTENDERS[contender][0]
    run: dict[str, Any] = {"workload": workload, "contender": contender}
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as out:
        marker = uuid.uuid4().hex
        env = {**_child_env(str(code_root) if code_root else None), MARKER_ENV: marker,
               "OMP_NUM_THREADS": str(cpu_threads_per_rank(RANKS)), CODE_NOTES_ENV: str(Path(out) / "code")}
        command = [sys.executable, "-m", "benchmarks.contenders.stages_job", "--framework", framework,
                   "--workload", workload, "--out", out, *(["--epochs", "1"] if quick else [])]
        load = os.getloadavg()[0]
        t0 = time.time()
        # cwd: not this checkout, whose `trainer` would come before PYTHONPATH's (`python -m` puts cwd first).
        logs = Path(out) / "stdout.txt", Path(out) / "stderr.txt"
        with logs[0].open("w") as stdout_file, logs[1].open("w") as stderr_file:
            process = subprocess.Popen([*command, "--t0", repr(t0)], cwd=out, env=env, stdout=stdout_file,
                                       stderr=stderr_file, start_new_session=True)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # The script's time is until its launching process exits (the shell's prompt comes back then).
        run.update(wall_s=time.time() - t0, returncode=process.returncode, load_before=load,
                   leftover=_leftovers(marker, t0), code=_code_notes(Path(out) / "code"))
        stdout, stderr = (path.read_text(errors="replace") for path in logs)
        if process.returncode == -signal.SIGKILL:
            stderr += f"\n(killed: over --timeout {timeout:.0f} s?)"
    record = next((json.loads(line[len(RESULT_PREFIX):]) for line in stdout.splitlines()
                   if line.startswith(RESULT_PREFIX)), None)
    wrong_code = _wrong_code(run["code"], code_root) if framework == "ours" else None
    if process.returncode != 0 or record is None or wrong_code:
        run["error"] = wrong_code or (stderr or stdout)[-3000:]
        return run
    run.update({key: record[key] for key in ("fit_s", "test_s", "startup_s", "test_metrics", "parameters")})
    run["exit_s"] = run["wall_s"] - record["test_end_s"]
    run["tree_end_s"] = run["leftover"]["tree_end_s"]
    return run


def _leftovers(marker: str, t0: float) -> dict[str, Any]:
    """Processes of the run's tree alive when its launching process exited, when the last of them
    ended (`tree_end_s`, from the start), and those still alive after a grace period (killed then,
    by pid, and reported)."""
    at_exit = still = _processes_with(marker)
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while still and time.monotonic() < deadline:
        time.sleep(0.05)
        still = _processes_with(marker)
    tree_end = None if still else time.time() - t0
    for pid in still:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"at_exit": list(at_exit.values()), "tree_end_s": tree_end, "after_grace_killed": list(still.values())}


def _processes_with(marker: str) -> dict[int, str]:
    """{pid: command line} of this user's processes whose environment carries the marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:  # gone, a zombie, or another user's
            continue
    return found


def _code_notes(notes: Path) -> list[dict[str, str]]:
    import ast

    return [ast.literal_eval(path.read_text()) for path in sorted(notes.glob("rank*.txt"))] if notes.exists() else []


def _wrong_code(notes: list[dict[str, str]], code_root: Path | None) -> str | None:
    """Every rank of our Trainer must have imported the checkout asked for (the "before" one, or this one)."""
    expected = os.path.realpath(code_root / "strategies" if code_root else REPO / "strategies")
    seen = {note.get("strategies", "") for note in notes}
    if len(notes) < RANKS or any(not path.startswith(expected + os.sep) for path in seen):
        return f"the ranks imported {sorted(seen)} ({len(notes)} notes), expected {expected}"
    return None


def interleaved(args: argparse.Namespace, code_roots: dict[str, Path]) -> list[dict[str, Any]]:
    """Every round runs each workload with every contender; `code_roots`: where a contender's
    `trainer` and `strategies` come from, if not from this working tree."""
    runs = []
    for repeat in range(args.repeats):
        shift = repeat % len(args.contenders)
        order = args.contenders[shift:] + args.contenders[:shift]
        for workload in args.workloads:
            for name in order:
                run = run_job(name, workload, args.timeout, code_roots.get(name), args.quick)
                run["repeat"] = repeat
                runs.append(run)
                _progress(run)
    return runs


def _progress(run: dict[str, Any]) -> None:
    left = run["leftover"]["after_grace_killed"]
    tail = f"  LEFTOVER {len(left)} killed" if left else ""
    if "error" in run:
        print(f"  {run['workload']:6s} {run['contender']:11s} FAILED (exit {run['returncode']}){tail}", flush=True)
        return
    print(f"  {run['workload']:6s} {run['contender']:11s} fit {run['fit_s']:6.2f} s  test {run['test_s']:5.2f} s  "
          f"total {run['wall_s']:6.2f} s  (load {run['load_before']:.2f}){tail}", flush=True)


# ---------------------------------------------------------------------- figures
def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """{workload: {"contenders": {name: {metric: stats}}, "ratios": {name: {of_medians, same_round}}}}."""
    summary: dict[str, Any] = {}
    for workload in dict.fromkeys(run["workload"] for run in runs):
        mine = [run for run in runs if run["workload"] == workload]
        ok = {name: {run["repeat"]: run for run in mine if run["contender"] == name and "error" not in run}
              for name in dict.fromkeys(run["contender"] for run in mine)}
        contenders: dict[str, dict[str, Any]] = {}
        for name, by_round in ok.items():
            mine_named = [run for run in mine if run["contender"] == name]
            contenders[name] = {metric: _stats([run[metric] for run in by_round.values()
                                                if run.get(metric) is not None]) for metric, _ in METRICS}
            contenders[name]["failed"] = sum(1 for run in mine_named if "error" in run)
            contenders[name]["leftover_killed"] = sum(len(run["leftover"]["after_grace_killed"]) for run in mine_named)
        ratios = {}
        for label, metric, top, bottom in RATIOS:
            if top in ok and bottom in ok and contenders[top][metric] and contenders[bottom][metric]:
                paired = [ok[top][r][metric] / ok[bottom][r][metric] for r in ok[top] if r in ok[bottom]]
                ratios[label] = {"of_medians": contenders[top][metric]["median"] / contenders[bottom][metric]["median"],
                                 "same_round": _stats(paired)}
        summary[workload] = {"contenders": contenders, "ratios": ratios}
    return summary


def render_tables(results: dict[str, Any]) -> str:
    summary = results["summary"]
    rows = ["| workload | contender | " + " | ".join(f"{title} (s)" for _, title in METRICS) + " |",
            "|---|---|" + "---|" * len(METRICS)]
    for workload, entry in summary.items():
        for name, stats in entry["contenders"].items():
            cells = [_fmt(stats[metric], 2) for metric, _ in METRICS]
            rows.append(f"| {workload} | {CONTENDERS[name][1]} | " + " | ".join(cells) + " |")
    labels = [label for label, *_ in RATIOS if any(label in entry["ratios"] for entry in summary.values())]
    if not labels:
        return "\n".join(rows)
    ratio_rows = ["| ratio of medians (min–max of same-round ratios) | " + " | ".join(summary) + " |",
                  "|---|" + "---|" * len(summary)]
    for label in labels:
        cells = [_ratio_cell(entry["ratios"].get(label)) for entry in summary.values()]
        ratio_rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(ratio_rows)


def _ratio_cell(ratio: dict[str, Any] | None) -> str:
    if not ratio:
        return "—"
    same = ratio["same_round"]
    return f"**{ratio['of_medians']:.2f}×** ({same['min']:.2f}–{same['max']:.2f})"


def render_rounds(results: dict[str, Any]) -> str:
    """Every round's fit / test / whole-script seconds."""
    names = list(dict.fromkeys(run["contender"] for run in results["runs"]))
    rows = ["| workload | round | " + " | ".join(f"{CONTENDERS[n][1]}: fit / test / total" for n in names) + " |",
            "|---|---|" + "---|" * len(names)]
    for workload in dict.fromkeys(run["workload"] for run in results["runs"]):
        for repeat in sorted({run["repeat"] for run in results["runs"]}):
            by_name = {run["contender"]: run for run in results["runs"]
                       if run["workload"] == workload and run["repeat"] == repeat}
            cells = ["failed" if "error" in by_name[n] else
                     f"{by_name[n]['fit_s']:.2f} / {by_name[n]['test_s']:.2f} / {by_name[n]['wall_s']:.2f}"
                     for n in names if n in by_name]
            rows.append(f"| {workload} | {repeat + 1} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    leftovers = sum(len(run["leftover"]["after_grace_killed"]) for run in results["runs"])
    failures = [f"{run['workload']} {CONTENDERS[run['contender']][1]} round {run['repeat'] + 1} (exit "
                f"{run['returncode']}: {_last_line(run['error'])})" for run in results["runs"] if "error" in run]
    return "\n".join([
        "# Stages: fit then test (#17)", "",
        f"Machine: {meta['cpu']}, {meta['cores']} cores; torch {meta['torch']}, pytorch_lightning "
        f"{meta['pytorch_lightning']}, Python {meta['python']}. {RANKS} ranks x 1 thread (gloo); "
        f"{meta['repeats']} interleaved rounds; load average at start/end {meta['load_before'][0]:.2f} / "
        f"{meta['load_after'][0]:.2f}. Ours now: {_now(meta)}"
        f"{' + uncommitted changes in ' + ', '.join(meta['dirty']) if meta['dirty'] else ''}; "
        f"before: {meta['before']}. Command: `{meta['command']}` (started {meta['started']}).", "",
        "Seconds, median (min–max) over rounds. fit() and test() are timed in the launching process; the whole "
        "script from outside, from its start to its launching process's exit; the last column until no process "
        "of its tree is left.", "",
        "Workloads: " + "; ".join(WORKLOAD_LABELS[w] for w in results["summary"]) + ".", "",
        render_tables(results), "",
        f"Failed runs: {len(failures)}{': ' + '; '.join(failures) if failures else ''}. "
        f"Processes of a run's tree still alive {LEFTOVER_GRACE_S:.0f} s after it exited: {leftovers}.", "",
        "## Every round", "", render_rounds(results), ""])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:160] if lines else "no output"


def _now(meta: dict[str, Any]) -> str:
    if meta.get("now"):
        return f"a checkout of {meta['now']}"
    moved = "" if meta["head_after"] == meta["head"] else f" ({meta['head_after']} at the end)"
    return f"the working tree at {meta['head']}{moved}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    if args.render:
        results = json.loads((out / "results.json").read_text())
        (out / "results.md").write_text(render_markdown(results))
        return results
    out.mkdir(parents=True, exist_ok=True)
    dirty = [] if args.now else [line[3:] for line in _git("status", "--porcelain", "--", "trainer", "strategies")
                                 .splitlines()]
    meta = {"command": "python -m benchmarks.stages " + " ".join(sys.argv[1:] if argv is None else argv),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": os.getloadavg(), **machine(),
            "repeats": args.repeats, "head": _git("rev-parse", "--short", "HEAD"), "dirty": dirty,
            "before": _git("rev-parse", "--short", args.before), "quick": args.quick,
            "now": _git("rev-parse", "--short", args.now) if args.now else None}
    print(f"benchmark: {meta['command']}  (load {meta['load_before'][0]:.2f}, {meta['cores']} cores)", flush=True)
    with ExitStack() as checkouts:
        code_roots = {}
        if args.now:
            code_roots["ours"] = checkouts.enter_context(checkout(meta["now"], Path(f"/tmp/ddp-now-{meta['now']}")))
        if "ours_before" in args.contenders:
            code_roots["ours_before"] = checkouts.enter_context(checkout(args.before, Path(args.before_root)))
        runs = interleaved(args, code_roots)
    meta["load_after"] = os.getloadavg()
    meta["head_after"] = _git("rev-parse", "--short", "HEAD")  # others may commit while it runs
    results = {"meta": meta, "runs": runs, "summary": summarize(runs)}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(render_markdown(results))
    print(render_tables(results))
    return results


if __name__ == "__main__":
    main()
