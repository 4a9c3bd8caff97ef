"""From the phases' raw records to figures: medians, paired ratios, targets, and the markdown.

Each window is a mean over its steps. A contender's step time in a round is the median of that
round's windows; its step time in a phase is the median over the measured rounds, and its spread
the lowest and highest round. Ratios between two
contenders are paired by round (both ran in the same round, minutes apart at most) and the median of
the per-round ratios is reported with its range: that cancels most of the machine's drift.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.gpu.loops import LABELS

AGREEMENT = 0.03  # the protocol's resolution: the same contender run twice must agree this closely
PAIRS = (("ours", "plain"), ("ours", "torch_ddp"), ("ours", "lightning"), ("ours_again", "ours"))


def contender_figures(entry: dict[str, Any], batch_size: int) -> dict[str, Any] | None:
    rounds = entry.get("rounds")
    if not rounds:
        return None
    per_round = [statistics.median(r["window_ms"]) for r in rounds]
    step_ms = statistics.median(per_round)
    busy = (entry.get("profile") or {}).get("gpu_busy_ms")
    return {"step_ms": step_ms, "step_ms_rounds": per_round, "spread": (min(per_round), max(per_round)),
            "samples_per_s": 1e3 * batch_size / step_ms,
            "measured_steps": sum(r["steps"] for r in rounds),
            "measured_s": sum(statistics.fmean(r["window_ms"]) * r["steps"] for r in rounds) / 1e3,
            "gap_ms": statistics.median(r["gap_ms_median"] for r in rounds),
            "gap_ms_mean": statistics.median(r["gap_ms_mean"] for r in rounds),
            "host_cpu_ms": statistics.median(r["host_cpu_ms"] for r in rounds),
            "host_ms": (entry.get("host") or {}).get("host_ms_median"),
            "gpu_busy_ms": busy, "gpu_idle_ms": step_ms - busy if busy is not None else None,
            "bound_by": _bound_by((entry.get("host") or {}).get("host_ms_median"), busy),
            "first_steps_s": entry["warmup"]["first_steps_s"], "steady": (entry.get("settle") or {}).get("steady"), "loss_at_step_3": entry["warmup"].get("loss_at_first_steps"),
            "peak_memory_gib": (entry.get("end") or {}).get("peak_memory_gib")}


def _bound_by(host_ms: float | None, busy_ms: float | None) -> str:
    """"host" when queueing a step takes the host longer than the device needs to run it."""
    if host_ms is None or busy_ms is None:
        return "n/a"
    return "host" if host_ms > busy_ms else "GPU"


def paired_ratio(first: dict[str, Any] | None, second: dict[str, Any] | None) -> dict[str, float] | None:
    """Throughput of `first` over `second` (second's step time / first's), per round: median and range."""
    if first is None or second is None:
        return None
    ratios = [b / a for a, b in zip(first["step_ms_rounds"], second["step_ms_rounds"])]
    return {"median": statistics.median(ratios), "low": min(ratios), "high": max(ratios)} if ratios else None


def summarize(phase: dict[str, Any], batch_size: int) -> dict[str, Any]:
    figures = {name: contender_figures(entry, batch_size) for name, entry in phase.get("contenders", {}).items()}
    figures = {name: value for name, value in figures.items() if value is not None}
    ratios = {f"{a}/{b}": paired_ratio(figures.get(a), figures.get(b)) for a, b in PAIRS}
    return {"figures": figures, "ratios": {key: value for key, value in ratios.items() if value is not None}}


def targets(phases: list[dict[str, Any]], kinds: dict[str, str]) -> list[dict[str, Any]]:
    """The issue's targets, judged on the paired medians of every phase that measured them."""
    rows = []
    for phase in phases:
        ratios, name = phase.get("summary", {}).get("ratios", {}), f"{phase['workload']} {phase['mode']}"
        if kinds.get(phase["workload"]) == "GPU-bound":
            rows.append(_row(f"ours / plain loop, {name}", ratios.get("ours/plain"), 0.98))
        if phase["mode"] == "compiled":
            rows.append(_row(f"ours / torch DDP, {name}", ratios.get("ours/torch_ddp"), 1.0))
        rows.append(_row(f"ours / Lightning, {name}", ratios.get("ours/lightning"), 1.0))
        agreement = ratios.get("ours_again/ours")
        if agreement is not None:
            met = abs(agreement["median"] - 1) <= AGREEMENT
            rows.append({"target": f"protocol: ours run twice agree, {name}", "measured": agreement["median"],
                         "needed": f"within ±{AGREEMENT:.0%}", "met": met})
    return rows


def _row(target: str, ratio: dict[str, float] | None, needed: float) -> dict[str, Any]:
    if ratio is None:
        return {"target": target, "measured": None, "needed": f">= {needed}", "met": None}
    return {"target": target, "measured": ratio["median"], "needed": f">= {needed}", "met": ratio["median"] >= needed}


# ---------------------------------------------------------------------- markdown
def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = ["# GPU benchmark", "", f"Command: `{meta['command']}`  ", f"Device: {meta['device']}; torch "
             f"{meta['torch']}, pytorch_lightning {meta['pytorch_lightning']}; precision {meta['precision']}; "
             f"each contender settles alone, then {meta['rounds']} measured rounds, interleaved, the order rotated "
             "each round.  ",
             f"Started {meta['started']}, took {meta.get('took_s', 0):.0f} s of a {meta['budget_s']:.0f} s budget.", ""]
    for phase in results["phases"]:
        lines += _phase_section(phase)
    lines += ["## Targets", "", "| target | measured | needed | met |", "|---|---|---|---|"]
    for row in results.get("targets", []):
        measured = "n/a" if row["measured"] is None else f"{row['measured']:.3f}"
        met = {True: "yes", False: "**no**", None: "n/a"}[row["met"]]
        lines.append(f"| {row['target']} | {measured} | {row['needed']} | {met} |")
    return "\n".join(lines) + "\n"


def _phase_section(phase: dict[str, Any]) -> list[str]:
    title = f"## {phase['workload']}, {phase['mode']}"
    if "skipped" in phase:
        return [title, "", f"Skipped: {phase['skipped']}.", ""]
    lines = [title, "", "| contender | step ms: median (rounds' range) | samples/s | measured | gap ms/step "
             "| host ms/step | host CPU ms/step | GPU busy ms/step | bound by | first 3 steps s (steady) | peak GiB | loss at step 3 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, value in phase["summary"]["figures"].items():
        label = LABELS.get(name, LABELS.get(name.removesuffix("_again"), name) + " (again)")
        lines.append(
            f"| {label} | {value['step_ms']:.2f} ({value['spread'][0]:.2f}–{value['spread'][1]:.2f}) "
            f"| {value['samples_per_s']:.0f} | {value['measured_steps']} steps, {value['measured_s']:.1f} s "
            f"| {value['gap_ms']:.3f} | {_number(value['host_ms'])} | {value['host_cpu_ms']:.2f} "
            f"| {_number(value['gpu_busy_ms'])} | {value['bound_by']} | {value['first_steps_s']:.1f} ({'yes' if value['steady'] else 'no'}) "
            f"| {_number(value['peak_memory_gib'])} | {_number(value['loss_at_step_3'], 5)} |")
    ratios = phase["summary"]["ratios"]
    if ratios:
        lines += ["", "Paired by round (throughput ratio, median and range): " + "; ".join(
            f"{key} {value['median']:.3f} ({value['low']:.3f}–{value['high']:.3f})" for key, value in ratios.items())]
    for name, error in phase.get("errors", {}).items():
        lines += ["", f"{name} failed: `{error.strip().splitlines()[-1][:300]}`"]
    return lines + [""]


def _number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
