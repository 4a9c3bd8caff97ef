"""Turn benchmark runs into figures: medians with min-max, ratios, targets, Markdown and plots.

Everything here reads only `results.json`-shaped data, so `python -m benchmarks.report
benchmarks/results/results.json` regenerates results.md, the plot and docs/results.md.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.contenders import ALL_CONTENDERS, BASELINE
from benchmarks.workloads import WORKLOADS

METRICS = ("samples_per_s", "launch_to_first_step_s", "peak_rss_mib")


# ---------------------------------------------------------------------- numbers
def _stats(values: list[float]) -> dict[str, float] | None:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)} \
        if values else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{workload: {contender: {metric: stats, ratio_vs_torch_ddp: stats of per-round ratios, ...}}}."""
    summary: dict[str, dict[str, Any]] = {}
    for workload in dict.fromkeys(run["workload"] for run in runs):
        mine = [run for run in runs if run["workload"] == workload]
        base = {run["repeat"]: run for run in mine if run["contender"] == BASELINE and "error" not in run}
        summary[workload] = {}
        for contender in dict.fromkeys(run["contender"] for run in mine):
            ok = [run for run in mine if run["contender"] == contender and "error" not in run]
            entry: dict[str, Any] = {metric: _stats([run[metric] for run in ok]) for metric in METRICS}
            entry["failed"] = sum(1 for run in mine if run["contender"] == contender and "error" in run)
            entry["final_loss"] = statistics.median([run["final_loss"] for run in ok]) if ok else None
            for metric, key in (("samples_per_s", "speed_vs_torch_ddp"), ("launch_to_first_step_s", "launch_vs_torch_ddp"),
                                ("peak_rss_mib", "rss_vs_torch_ddp")):
                paired = [run[metric] / base[run["repeat"]][metric] for run in ok if run["repeat"] in base]
                entry[key] = _stats(paired)
            summary[workload][contender] = entry
    return summary


def _median(summary: dict[str, Any], workload: str, contender: str, metric: str = "samples_per_s") -> float | None:
    entry = summary.get(workload, {}).get(contender)
    return entry[metric]["median"] if entry and entry.get(metric) else None


def _ratio(summary: dict[str, Any], workload: str, top: str, bottom: str, metric: str = "samples_per_s") -> float | None:
    a, b = _median(summary, workload, top, metric), _median(summary, workload, bottom, metric)
    return a / b if a is not None and b else None


def targets(summary: dict[str, Any], accuracy: dict[str, Any] | None,
            launch: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The issue's targets, each as measured ratio vs threshold (ratios of medians). Launch
    targets use the launch-only rounds (`launch`) when the run has them."""
    found: list[dict[str, Any]] = []

    def check(name: str, value: float | None, threshold: float, higher_is_better: bool = True) -> None:
        met = None if value is None else (value >= threshold if higher_is_better else value <= threshold)
        found.append({"target": name, "measured": value, "threshold": threshold, "met": met})

    kinds = {name: work.kind for name, work in WORKLOADS.items()}
    for workload in summary:
        kind = kinds.get(workload, workload)
        check(f"ours / torch DDP, {workload} ({kind})", _ratio(summary, workload, "ours", BASELINE),
              1.15 if kind == "comm-bound" else 1.00)
        if kind != "comm-bound":
            check(f"ours / Lightning ddp, {workload}", _ratio(summary, workload, "ours", "pl_ddp"), 1.10)
        check(f"Lightning+our strategy / Lightning ddp, {workload}", _ratio(summary, workload, "pl_ours", "pl_ddp"), 1.00)
        if kind == "comm-bound":
            check(f"ours bf16 / torch DDP, {workload}", _ratio(summary, workload, "ours_bf16", BASELINE), 1.40)
        launch_rounds = launch if launch is not None and workload in launch else None
        check(f"launch->first step ours / torch DDP, {workload}" + (" (launch-only rounds)" if launch_rounds else ""),
              _ratio(launch_rounds or summary, workload, "ours", BASELINE, "launch_to_first_step_s"),
              1.05, higher_is_better=False)
        check(f"peak RSS per rank ours / torch DDP, {workload}",
              _ratio(summary, workload, "ours", BASELINE, "peak_rss_mib"), 1.00, higher_is_better=False)
    if accuracy:
        fp32, bf16 = _mean(accuracy["val_acc"]["fp32"]), _mean(accuracy["val_acc"]["bf16"])
        gap = None if fp32 is None or bf16 is None else 100 * abs(fp32 - bf16)
        check("digits val_acc |bf16 - fp32| comm (points)", gap, 1.0, higher_is_better=False)
    return found


def _mean(values: list[float | None]) -> float | None:
    kept = [value for value in values if value is not None]
    return statistics.fmean(kept) if kept else None


def summarize_sweep(sweep: dict[str, Any]) -> dict[str, Any]:
    by_cap: dict[str, Any] = {}
    for cap in [*sweep["caps"], "torch_ddp"]:
        runs = [run for run in sweep["runs"] if run["cap"] == cap and "error" not in run]
        by_cap[cap] = {"samples_per_s": _stats([run["samples_per_s"] for run in runs]),
                       "buckets": runs[-1]["reducer"]["buckets"] if runs and runs[-1].get("reducer") else None,
                       "chosen_mb": ((runs[-1].get("reducer") or {}).get("autotune") or {}).get("chosen_mb")
                       if runs else None}
    return {"workload": sweep["workload"], "by_cap": by_cap}


# ---------------------------------------------------------------------- Markdown
def _label(name: str) -> str:
    base, _, tag = name.partition("@")
    label = ALL_CONTENDERS[base].label if base in ALL_CONTENDERS else base
    return f"{label} [before: --baseline-root]" if tag else label


def _fmt(stats: dict[str, float] | None, digits: int = 1) -> str:
    if not stats:
        return "failed"
    return f"{stats['median']:.{digits}f} ({stats['min']:.{digits}f}–{stats['max']:.{digits}f})"


def render_table(results: dict[str, Any]) -> str:
    """One row per workload x contender: medians (min–max) and ratios vs the torch DDP loop."""
    lines = ["| workload | contender | samples/s | × torch DDP | launch→first step (s) | peak RSS/rank (MiB) |",
             "|---|---|---|---|---|---|"]
    for workload, contenders in results["summary"].items():
        for name, entry in contenders.items():
            speed = entry.get("speed_vs_torch_ddp")
            ratio = _ratio(results["summary"], workload, name, BASELINE)
            ratio_text = "—" if ratio is None else f"**{ratio:.2f}×**" + (
                f" ({speed['min']:.2f}–{speed['max']:.2f})" if speed and name != BASELINE else "")
            label = _label(name)
            lines.append(f"| {workload} ({WORKLOADS[workload].kind}) | {label} | {_fmt(entry['samples_per_s'])} | "
                         f"{ratio_text} | {_fmt(entry['launch_to_first_step_s'], 2)} | "
                         f"{_fmt(entry['peak_rss_mib'], 0)} |")
    return "\n".join(lines)


def render_breakdown(results: dict[str, Any]) -> str:
    """Our step split into phases by the TelemetryMonitor (median over repeats, measured steps only)."""
    keys = ("step_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms", "comm_ms", "overlap_pct")
    lines = ["| workload | contender | step | forward | backward | exposed comm | optimizer | comm (total) | overlap |",
             "|---|---|---|---|---|---|---|---|---|"]
    for workload in results["summary"]:
        for name in ("ours", "ours_gloo", "ours_bf16"):
            runs = [run["telemetry"] for run in results["runs"] if run["workload"] == workload
                    and run["contender"] == name and run.get("telemetry")]
            if not runs:
                continue
            cells = [statistics.median(run.get(key, 0.0) for run in runs) for key in keys]
            text = [f"{value:.1f} ms" for value in cells[:-1]] + [f"{cells[-1]:.0f}%"]
            lines.append(f"| {workload} | {_label(name)} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def render_launch(results: dict[str, Any]) -> str:
    """The launch-only rounds: launch -> first step per contender, and the per-round ratio."""
    meta = results["meta"]
    lines = [f"{meta.get('launch_repeats')} launch-only rounds per workload (each run stops after its second step; "
             "the pair's order alternates every round):", "",
             "| workload | contender | launch→first step (s) | ÷ torch DDP, same round |", "|---|---|---|---|"]
    for workload, contenders in results["launch"].items():
        for name, entry in contenders.items():
            paired = entry.get("launch_vs_torch_ddp")
            ratio = "—" if name == BASELINE or not paired else _fmt(paired, 3)
            lines.append(f"| {workload} | {_label(name)} | {_fmt(entry['launch_to_first_step_s'], 2)} | {ratio} |")
    return "\n".join(lines)


def render_targets(results: dict[str, Any]) -> str:
    lines = ["| target | measured | needed | met |", "|---|---|---|---|"]
    for item in results.get("targets", []):
        value = "n/a" if item["measured"] is None else f"{item['measured']:.3f}"
        comparator = "≤" if "RSS" in item["target"] or "launch" in item["target"] or "points" in item["target"] else "≥"
        met = {True: "yes", False: "**no**", None: "n/a"}[item["met"]]
        lines.append(f"| {item['target']} | {value} | {comparator} {item['threshold']} | {met} |")
    return "\n".join(lines)


def _context(results: dict[str, Any]) -> str:
    meta = results["meta"]
    steps = ", ".join(f"{w}: {w_s[0]} warm-up + {w_s[1]} measured steps, batch {meta['batch_per_rank'][w]}/rank"
                      for w, w_s in meta["steps"].items())
    cuda = meta.get("cuda") or "none (CPU only: no GPU figures)"
    return (f"Machine: {meta['cpu']}, {meta['cores']} cores; torch {meta['torch']}, pytorch_lightning "
            f"{meta['pytorch_lightning']}, Python {meta['python']}; CUDA device: {cuda}.  \n"
            f"{_placement(meta)}; {meta['repeats']} interleaved repeats; {steps}.  \n"
            f"Load average at start/end: {meta['load_before'][0]:.2f} / {meta.get('load_after', [float('nan')])[0]:.2f}. "
            f"Command: `{meta['command']}` (started {meta['started']}).")


def _placement(meta: dict[str, Any]) -> str:
    """Runs from before `--accelerator` existed recorded none of it: 2 CPU ranks in fp32."""
    ranks, precision = meta.get("ranks", 2), meta.get("precision", "32-true")
    if meta.get("accelerator", "cpu") == "cuda":
        return f"{ranks} rank(s) x 1 GPU (nccl) for DDP contenders, precision {precision}"
    return f"{ranks} ranks x 1 thread (gloo) for DDP contenders, precision {precision}"


def render_markdown(results: dict[str, Any]) -> str:
    parts = ["# Benchmark results", "", _context(results), "", render_table(results), "",
             "## Where our step goes (TelemetryMonitor, per optimizer step)", "", render_breakdown(results), "",
             "## Targets", "", render_targets(results)]
    if results.get("launch"):
        parts += ["", "## Launch to first step", "", render_launch(results)]
    if results.get("accuracy"):
        parts += ["", "## bf16 communication: digits accuracy", "", _render_accuracy(results["accuracy"])]
    if results.get("sweep"):
        parts += ["", "## Bucket-size sweep", "", _render_sweep(results["sweep"])]
    return "\n".join(parts) + "\n"


def _render_accuracy(accuracy: dict[str, Any]) -> str:
    rows = ["| communication | val_acc per seed | mean |", "|---|---|---|"]
    for name, values in accuracy["val_acc"].items():
        shown = ", ".join("failed" if v is None else f"{100 * v:.2f}" for v in values)
        mean = _mean(values)
        rows.append(f"| {name} | {shown} | {'n/a' if mean is None else f'{100 * mean:.2f}'} |")
    return "\n".join(rows) + f"\n\nCommand: `{accuracy['command']}`."


def _render_sweep(sweep: dict[str, Any]) -> str:
    rows = [f"Ours on `{sweep['workload']}` by `bucket_cap_mb` (torch DDP at its default 25 MiB for reference).", "",
            "| bucket_cap_mb | buckets | samples/s |", "|---|---|---|"]
    for cap, entry in sweep["by_cap"].items():
        label = f"auto → {entry['chosen_mb']}" if cap == "auto" else cap
        rows.append(f"| {label} | {entry['buckets'] if entry['buckets'] is not None else '—'} | "
                    f"{_fmt(entry['samples_per_s'])} |")
    return "\n".join(rows)


def render_readme_section(results: dict[str, Any]) -> str:
    """The README's results section (docs/results.md), regenerated from results.json."""
    return "\n".join([
        "## Results", "",
        "Throughput (samples/s, median and min–max of interleaved repeats), launch to first optimizer step and "
        "peak memory per rank, for three workloads and six ways to train them. Produced by `make bench` "
        "(`python -m benchmarks.run`); method, profiles and what each optimisation bought: "
        "[benchmarks/README.md](../benchmarks/README.md).", "",
        _context(results), "", render_table(results), "", "![throughput vs torch DDP](../benchmarks/results/results.png)",
        "", "Where our step goes (`TelemetryMonitor`, ms per optimizer step, median over repeats):", "",
        render_breakdown(results), "", "### Targets", "", render_targets(results), "",
        *(["### Launch to first step", "", render_launch(results), ""] if results.get("launch") else []),
        *(["### bf16 communication and accuracy", "", _render_accuracy(results["accuracy"]), ""]
          if results.get("accuracy") else []),
        *(["### Bucket size", "", _render_sweep(results["sweep"]), "",
           "![bucket-size sweep](../benchmarks/results/sweep.png)", ""] if results.get("sweep") else []),
    ])


# ---------------------------------------------------------------------- plots
def plot_results(results: dict[str, Any], path: Path) -> None:
    """Three panels: throughput relative to torch DDP (min–max bars), launch time, peak RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = results["summary"]
    workloads = list(summary)
    names = list(dict.fromkeys(name for entries in summary.values() for name in entries))
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.4))
    width = 0.8 / max(1, len(names))
    panels = (("speed_vs_torch_ddp", "throughput / torch DDP"), ("launch_to_first_step_s", "launch → first step (s)"),
              ("peak_rss_mib", "peak RSS per rank (MiB)"))
    for axis, (metric, title) in zip(axes, panels):
        for index, name in enumerate(names):
            stats = [summary[w].get(name, {}).get(metric) for w in workloads]
            medians = [s["median"] if s else 0.0 for s in stats]
            errors = [[m - s["min"] if s else 0 for m, s in zip(medians, stats)],
                      [s["max"] - m if s else 0 for m, s in zip(medians, stats)]]
            positions = [w + (index - (len(names) - 1) / 2) * width for w in range(len(workloads))]
            axis.bar(positions, medians, width, yerr=errors, capsize=2, label=_label(name))
        axis.set_xticks(range(len(workloads)), [f"{w}\n({WORKLOADS[w].kind})" for w in workloads])
        axis.set_title(title)
        if metric == "speed_vs_torch_ddp":
            axis.axhline(1.0, color="black", linewidth=0.8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(sweep: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize_sweep(sweep)["by_cap"]
    numeric = [cap for cap in sweep["caps"] if cap != "auto" and summary[cap]["samples_per_s"]]
    fig, axis = plt.subplots(figsize=(7, 4.2))
    xs = [float(cap) for cap in numeric]
    medians = [summary[cap]["samples_per_s"]["median"] for cap in numeric]
    low = [m - summary[cap]["samples_per_s"]["min"] for m, cap in zip(medians, numeric)]
    high = [summary[cap]["samples_per_s"]["max"] - m for m, cap in zip(medians, numeric)]
    axis.errorbar(xs, medians, yerr=[low, high], marker="o", capsize=3, label="ours, fixed bucket_cap_mb")
    for cap, style, label in (("auto", "--", "ours, bucket_cap_mb='auto'"), ("torch_ddp", ":", "torch DDP (25 MiB)")):
        stats = summary.get(cap, {}).get("samples_per_s")
        if stats:
            axis.axhline(stats["median"], linestyle=style, color="gray" if cap == "torch_ddp" else "green", label=label)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("bucket_cap_mb (MiB)")
    axis.set_ylabel("samples/s (median, min–max)")
    axis.set_title(f"bucket-size sweep, {sweep['workload']} ({WORKLOADS[sweep['workload']].kind})")
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def regenerate(results_path: Path, docs: Path | None = None) -> None:
    """Re-render every output from a results.json (no benchmark runs)."""
    results = json.loads(results_path.read_text())
    out = results_path.parent
    (out / "results.md").write_text(render_markdown(results))
    plot_results(results, out / "results.png")
    if (out / "sweep.json").exists():
        plot_sweep(json.loads((out / "sweep.json").read_text()), out / "sweep.png")
    if docs is not None:
        docs.write_text(render_readme_section(results))


if __name__ == "__main__":
    regenerate(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
