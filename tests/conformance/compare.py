"""Run one corpus case under Lightning's Trainer and under ours, and compare everything recorded.

`run_case(case, tmp_path, processes)` returns `(lightning, ours)` `RunRecord`s, each from a fresh
directory; `assert_conformant(lightning, ours)` raises an AssertionError whose message is a
readable diff: ours' exception if it raised, the first differing hook call with context, the
`trainer.*` and metric values that differ at the same hook occurrence, logger rows, stage
results, checkpoints and weights.

Tolerances (`TOLERANCES`): at 1 process both Trainers run the same float32 kernels in the same
order on one thread, so weights, losses and learning rates are expected bit-identical; atol and
rtol of 1e-6 (a few float32 ulps) only absorb epoch means accumulated in float64 by one Trainer
and in float32 by the other. At 2 processes gradients are averaged by different reducers (ours
and torch DDP), whose summation order may differ in the last bits, and sync_dist sums run in
float64 vs float32: 1e-5.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tests.conformance.cases import Case
from tests.conformance.recording import (ABSENT, CHECKPOINT_KEYS, PARENT, RECORDERS, Recorder, attach_recorder,
                                         metric_dict)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


TOLERANCES = {1: Tolerance(atol=1e-6, rtol=1e-6), 2: Tolerance(atol=1e-5, rtol=1e-5)}

# Where our Trainer differs from Lightning on purpose. Each entry names the difference, says
# where it is documented and what the comparison does about it; `normalise` applies them to our
# record and notes every change it makes in the report, so nothing is dropped silently.
DELIBERATE_DIFFERENCES = {
    "telemetry": "Our Trainer adds a TelemetryMonitor callback by default (enable_telemetry=True, "
                 "docs/trainer-contract.md, trainer/callbacks/telemetry.py). Dropped from our record: the callback "
                 "from trainer.callbacks and every 'telemetry/*' key from metric dicts and logger rows (the default "
                 "one writes none; its figures show only in our progress bar's text, never in the metrics dicts).",
    "exactly_once_eval": "Under DDP our evaluation loaders are unpadded shards (docs/scaling.md, 'Evaluation is "
                         "exactly once'); Lightning pads with duplicates. Not normalised: every evaluation set in the "
                         "corpus has a size divisible by the world size, where both hand each rank the same "
                         "samples; an uneven set would show up as a difference, not be hidden.",
}

# Where the oracle itself cannot answer. Lightning's `ddp_spawn` (the only Lightning launcher that
# runs inside a test process) starts fresh workers for every stage from the launching process's
# trainer, and sends back only trainer.state, callback_metrics, the return value, best_model_path
# and (after fit only) the weights. Both entries are applied to both records at 2 processes only,
# and the report names them; values a module derives from them (a metric logged as
# current_epoch) are not normalised and still show.
ORACLE_LIMITATIONS = {
    # Launching-process stage fields Lightning never updates; "weights" only after validate/test/predict.
    "spawn_parent_state": ("global_step", "current_epoch", "should_stop", "logged_metrics", "progress_bar_metrics",
                           "early_stopping", "checkpoint_callback.best_model_score",
                           "checkpoint_callback.last_model_path", "checkpoint_callback.best_k_models", "weights"),
    # In every stage after the first, Lightning's fresh workers start from that stale trainer: hook
    # snapshots see global_step=current_epoch=0 and metrics dicts the parent never received (or merged
    # into its old ones: its callback_metrics keep the fit's keys after test), logger rows are written at
    # step 0 of epoch 0. Lightning's in-process Trainer (the 1-process cases) checks all of these.
    # Likewise a stage's hooks see what earlier stages left on the trainer (their batch counts,
    # is_last_batch, the optimizers' lr) in a trainer that ran them (ours, and Lightning's `ddp`, whose
    # rank 0 is the caller: tests/conformance/test_caller_state.py compares that), never under ddp_spawn.
    "spawn_stage_restart": ("state.global_step", "state.current_epoch", "state metrics dicts", "logger row step",
                            "logger row epoch", "result callback_metrics", "fields an earlier stage left"),
}
_STAGE_FIELDS = {"fit": ("num_training_batches", "num_sanity_val_batches", "num_val_batches", "is_last_batch", "lr"),
                 "validate": ("num_val_batches",), "test": ("num_test_batches",), "predict": ("num_predict_batches",)}


def _left_by_earlier_stages(stage: str) -> tuple[str, ...]:
    """The snapshot fields another stage sets and `stage` does not: left over in a trainer that ran it."""
    own = set(_STAGE_FIELDS.get(stage, ()))
    return tuple(sorted({key for keys in _STAGE_FIELDS.values() for key in keys} - own))


@dataclass
class RunRecord:
    trainer: str
    processes: int
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    reload: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- running
def run_case(case: Case, tmp_path: Path, processes: int = 1, against: str = "ours") -> tuple[RunRecord, RunRecord]:
    """Run `case` under Lightning and under `against` ("ours", or "lightning" to check the
    harness itself is deterministic), each in its own fresh directory under `tmp_path`."""
    lightning = run_one(case, "lightning", tmp_path / "lightning", processes)
    other = run_one(case, against, tmp_path / against if against != "lightning" else tmp_path / "lightning_again",
                    processes)
    if against == "ours":
        normalise(other)
    if processes > 1:
        for record in (lightning, other):
            _without_spawn_stage_restart(record)
    return lightning, other


def _without_spawn_stage_restart(record: RunRecord) -> None:
    """ORACLE_LIMITATIONS["spawn_stage_restart"]: from the second stage on, drop the loop counters and
    the metrics dicts from hook snapshots, the step and epoch from logger rows, and callback_metrics
    from the stage results (in both records)."""
    for events in record.events.values():
        stage, name = 0, ""
        for event in events:
            if event["src"] == "driver":
                stage, name = stage + 1, event["hook"]
            elif stage > 1 and event["stream"] == "logger":
                if "step" in event["args"]:
                    event["args"]["step"] = "<not compared>"
                if isinstance(event.get("data"), dict) and "epoch" in event["data"]:
                    event["data"]["epoch"] = "<not compared>"
            elif stage > 1 and event.get("state"):
                for key in ("global_step", "current_epoch", "callback_metrics", "logged_metrics",
                            "progress_bar_metrics", *_left_by_earlier_stages(name)):
                    event["state"].pop(key, None)
    for result in record.stages[1:]:
        result.pop("callback_metrics", None)


def run_one(case: Case, kind: str, root: Path, processes: int, observe: bool = True) -> RunRecord:
    """One Trainer's run of `case`. `observe=False` leaves out the recording callback and the
    module's recorder (only the logger still records), to check that observing changes nothing."""
    torch.set_num_threads(1)
    package = importlib.import_module(case.package)
    callback_class, logger_class = RECORDERS[case.package]
    record = RunRecord(kind, processes)
    # Lightning's ddp_spawn runs rank 0 in a child, so the launching process's own events are no
    # rank's; our ddp runs rank 0 in the launching process, so they are rank 0's.
    spawned_rank_zero = processes > 1 and kind == "lightning"
    recorder = Recorder(str(root / "records"), kind, parent_pid=os.getpid() if spawned_rank_zero else None)
    trainer = module = None
    try:
        package.seed_everything(0, verbose=False)
        watcher = recorder if observe else None
        module = attach_recorder(case.module(), watcher)
        data = attach_recorder(case.data(), watcher) if case.data is not None else None
        callbacks = [callback_class(recorder)] if observe else []
        callbacks += case.callbacks(package.callbacks, str(root / "checkpoints"))
        kwargs: dict[str, Any] = dict(default_root_dir=str(root), logger=logger_class(recorder), callbacks=callbacks,
                                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                                      devices=processes)
        kwargs.update({k: v for k, v in case.trainer.items()})
        kwargs = {k: v for k, v in kwargs.items() if v is not None}  # None: leave the Trainer's default
        trainer = _make_trainer(kind, package, processes, kwargs, case.find_unused_parameters)
    except Exception as error:  # noqa: BLE001 - the failure is what the test reports
        record.error = _describe_error("Trainer(...)", error)
    if trainer is not None:
        for stage, stage_kwargs in case.stages:
            recorder.mark(stage)
            try:
                output = getattr(trainer, stage)(module, datamodule=data, **stage_kwargs)
            except Exception as error:  # noqa: BLE001
                record.error = _describe_error(f"trainer.{stage}({_kwargs_text(stage_kwargs)})", error)
                break
            try:
                record.stages.append(stage_summary(trainer, stage, stage_kwargs, output, module, root))
            except Exception as error:  # noqa: BLE001 - a Trainer attribute the summary reads is missing
                record.error = _describe_error(f"reading the Trainer after {stage}()", error)
                break
        if case.reload and record.error is None:
            record.reload = _reload(type(module), trainer, root)
    record.events = recorder.read()
    record.checkpoints = {os.path.relpath(p, root): checkpoint_summary(p) for p in sorted(root.rglob("*.ckpt"))}
    return record


def _make_trainer(kind: str, package: Any, processes: int, kwargs: dict[str, Any], find_unused: bool) -> Any:
    suffix = "_find_unused_parameters_true" if find_unused else ""
    if kind == "lightning":
        return package.Trainer(strategy=f"ddp_spawn{suffix}" if processes > 1 else "auto", **kwargs)
    from trainer import Trainer

    return Trainer(strategy=f"ddp{suffix}" if processes > 1 else "auto", **kwargs)


def _describe_error(where: str, error: BaseException) -> str:
    """One line: the exception, its first message line and the innermost frame outside this harness."""
    frames = traceback.extract_tb(error.__traceback__)
    outside = [f for f in frames if "/tests/conformance/" not in f.filename]
    origin = outside[-1] if outside else (frames[-1] if frames else None)
    at = f" (raised at {os.path.relpath(origin.filename)}:{origin.lineno})" if origin else ""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{where} raised {type(error).__name__}: {message}{at}"


def _kwargs_text(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def stage_summary(trainer: Any, stage: str, kwargs: Mapping[str, Any], output: Any, module: Any,
                  root: Path) -> dict[str, Any]:
    status = getattr(trainer, "state", None)
    summary: dict[str, Any] = {
        "call": f"{stage}({_kwargs_text(kwargs)})",
        "output": _output(output),
        "global_step": trainer.global_step, "current_epoch": trainer.current_epoch,
        "should_stop": trainer.should_stop, "interrupted": getattr(trainer, "interrupted", ABSENT),
        "state.fn": _value(getattr(status, "fn", ABSENT)), "state.status": _value(getattr(status, "status", ABSENT)),
        "callback_metrics": metric_dict(trainer.callback_metrics),
        "logged_metrics": metric_dict(trainer.logged_metrics),
        "progress_bar_metrics": metric_dict(trainer.progress_bar_metrics),
        "callbacks": [type(c).__name__ for c in trainer.callbacks],
        "weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
    }
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None:
        summary["checkpoint_callback"] = {
            "best_model_path": _relative(checkpoint.best_model_path, root),
            "best_model_score": _number(checkpoint.best_model_score),
            "last_model_path": _relative(getattr(checkpoint, "last_model_path", ""), root),
            "best_k_models": {_relative(k, root): _number(v)
                              for k, v in getattr(checkpoint, "best_k_models", {}).items()},
        }
    stopper = trainer.early_stopping_callback
    if stopper is not None:
        summary["early_stopping"] = {"stopped_epoch": stopper.stopped_epoch, "wait_count": stopper.wait_count,
                                     "best_score": _number(stopper.best_score)}
    return summary


def _value(value: Any) -> Any:
    return getattr(value, "value", value)


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, (torch.Tensor, int, float)) else value


def _relative(path: Any, root: Path) -> Any:
    return os.path.relpath(path, root) if path else path


def _output(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.detach().clone()
    if isinstance(output, Mapping):
        return metric_dict(output)
    if isinstance(output, (list, tuple)):
        return [_output(item) for item in output]
    return output


def checkpoint_summary(path: Path) -> dict[str, Any]:
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # noqa: BLE001
        return {"load_error": f"{type(error).__name__}: {error}"}
    summary = {key: checkpoint[key] for key in CHECKPOINT_KEYS if key in checkpoint}
    if "hyper_parameters" in summary:
        summary["hyper_parameters"] = {str(k): v for k, v in dict(summary["hyper_parameters"]).items()}
    summary["top_level_keys"] = sorted(map(str, checkpoint))
    summary["has_callbacks"] = "callbacks" in checkpoint
    summary["callback_keys"] = sorted(map(str, checkpoint.get("callbacks", {}) or {}))
    return summary


def _reload(cls: Any, trainer: Any, root: Path) -> dict[str, Any]:
    """`Module.load_from_checkpoint(best)`: the hyperparameters, weights and extra state it restores."""
    path = trainer.checkpoint_callback.best_model_path
    try:
        restored = cls.load_from_checkpoint(path)
    except Exception as error:  # noqa: BLE001
        return {"path": _relative(path, root), "error": _describe_error("load_from_checkpoint", error)}
    return {"path": _relative(path, root), "hparams": {str(k): v for k, v in dict(restored.hparams).items()},
            "weights": {k: v.detach().clone() for k, v in restored.state_dict().items()},
            "restored_extra": getattr(restored, "restored_extra", None)}


# ---------------------------------------------------------------------- the allow-list, applied
def normalise(record: RunRecord) -> RunRecord:
    """Apply DELIBERATE_DIFFERENCES["telemetry"] to our record, noting what was removed."""
    dropped: Counter[str] = Counter()

    def strip(metrics: Any) -> Any:
        if not isinstance(metrics, dict):
            return metrics
        for key in [k for k in metrics if k.startswith("telemetry/")]:
            dropped[key] += 1
            del metrics[key]
        return metrics

    for events in record.events.values():
        for event in events:
            for name in ("callback_metrics", "logged_metrics", "progress_bar_metrics"):
                strip((event.get("state") or {}).get(name))
        rows = [e for e in events if e["stream"] == "logger" and e["hook"] == "log_metrics"]
        for row in rows:
            only_telemetry = all(k.startswith("telemetry/") or k == "epoch" for k in row["data"] or {})
            strip(row["data"])
            row["args"]["keys"] = sorted(row["data"] or {})
            if only_telemetry:
                events.remove(row)
                dropped["<logger rows holding only telemetry/* and epoch>"] += 1
    for stage in record.stages:
        for name in ("callback_metrics", "logged_metrics", "progress_bar_metrics"):
            strip(stage[name])
        if "TelemetryMonitor" in stage["callbacks"]:
            stage["callbacks"].remove("TelemetryMonitor")
            dropped["<TelemetryMonitor in trainer.callbacks>"] += 1
    if dropped:
        record.notes.append("telemetry: removed " + ", ".join(f"{k} x{n}" for k, n in sorted(dropped.items())))
    return record


# ---------------------------------------------------------------------- comparing
def diff_values(a: Any, b: Any, path: str, tol: Tolerance, out: list[tuple[str, Any, Any]]) -> None:
    """Append (path, lightning value, our value) for every difference; Lightning's ABSENT or
    "<error: ...>" values are not compared (Lightning is the oracle: it has nothing to say)."""
    if isinstance(a, str) and (a == ABSENT or a.startswith("<error")):
        return
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in a:
            sub = f"{path}[{key!r}]"
            if key not in b:
                out.append((sub, a[key], "<missing>"))
            else:
                diff_values(a[key], b[key], sub, tol, out)
        out.extend((f"{path}[{key!r}]", "<missing>", b[key]) for key in b if key not in a)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):  # one line with both lists: element-wise lines would cascade
            out.append((path, a, b))
            return
        for index, (x, y) in enumerate(zip(a, b)):
            diff_values(x, y, f"{path}[{index}]", tol, out)
    elif isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            out.append((f"{path}.shape", tuple(a.shape), tuple(b.shape)))
        elif a.numel() and not torch.allclose(a.double(), b.double(), atol=tol.atol, rtol=tol.rtol, equal_nan=True):
            worst = float((a.double() - b.double()).abs().max())
            out.append((path, f"<tensor {_short(a)}>", f"<tensor, max |diff| {worst:.3g}>"))
    elif isinstance(a, bool) or isinstance(b, bool):
        if a is not b:
            out.append((path, a, b))
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
        if not both_nan and not math.isclose(a, b, rel_tol=tol.rtol, abs_tol=tol.atol):
            out.append((path, a, b))
    elif type(a) is not type(b) or a != b:
        out.append((path, a, b))


def _short(value: Any, width: int = 90) -> str:
    if isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, torch.Tensor):
        text = f"shape {tuple(value.shape)}, sum {float(value.double().sum()):.6g}"
    else:
        text = json.dumps(value, default=repr) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 3] + "..."


def _call(event: dict[str, Any]) -> str:
    args = json.dumps(event["args"], separators=(",", ":"), default=repr)
    return f"{event['src']}.{event['hook']}({args[1:-1]})"


def _stream(events: list[dict[str, Any]], stream: str) -> list[dict[str, Any]]:
    return [e for e in events if e["stream"] == stream]


def _first_sequence_difference(ours_name: str, a: list[dict[str, Any]], b: list[dict[str, Any]],
                               label: str) -> list[str]:
    calls_a, calls_b = [_call(e) for e in a], [_call(e) for e in b]
    if calls_a == calls_b:
        return []
    index = next((i for i, (x, y) in enumerate(zip(calls_a, calls_b)) if x != y), min(len(calls_a), len(calls_b)))
    x = calls_a[index] if index < len(calls_a) else "<end>"
    y = calls_b[index] if index < len(calls_b) else "<end>"
    lines = [f"{label}: call {index}: Lightning {x}, {ours_name} {y}   ({len(calls_a)} vs {len(calls_b)} calls)"]
    for i in range(max(0, index - 4), index + 4):
        left = calls_a[i] if i < len(calls_a) else ""
        right = calls_b[i] if i < len(calls_b) else ""
        lines.append(f"   {'>' if i == index else ' '} {i:4d}  {_short(left, 70):70s} | {_short(right, 70)}")
    counts_a = Counter(f"{e['src']}.{e['hook']}" for e in a)
    counts_b = Counter(f"{e['src']}.{e['hook']}" for e in b)
    differing = sorted(k for k in counts_a | counts_b if counts_a[k] != counts_b[k])
    if differing:
        lines.append("     call counts (Lightning/" + ours_name + "): "
                     + "; ".join(f"{k} {counts_a[k]}/{counts_b[k]}" for k in differing[:14])
                     + (f"; ... {len(differing) - 14} more" if len(differing) > 14 else ""))
    return lines


def _occurrences(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    seen: Counter[str] = Counter()
    keyed = {}
    for event in events:
        name = f"{event['src']}.{event['hook']}"
        keyed[f"{name}#{seen[name]}"] = event
        seen[name] += 1
    return keyed


def _occurrence_differences(ours_name: str, a: list[dict[str, Any]], b: list[dict[str, Any]], tol: Tolerance,
                            label: str, limit: int = 16) -> list[str]:
    """Values (`state`, `data`) at the same occurrence of the same hook, grouped by field."""
    keyed_b = _occurrences(b)
    first: dict[str, tuple[str, Any, Any]] = {}
    counts: Counter[str] = Counter()
    for where, event in _occurrences(a).items():
        other = keyed_b.get(where)
        if other is None:
            continue
        found: list[tuple[str, Any, Any]] = []
        diff_values(event.get("state") or {}, other.get("state") or {}, "state", tol, found)
        diff_values(event.get("data") or {}, other.get("data") or {}, "data", tol, found)
        for path, x, y in found:
            counts[path] += 1
            first.setdefault(path, (where, x, y))
    lines = []
    for path, (where, x, y) in list(first.items())[:limit]:
        lines.append(f"{label}: {path} at {where}: Lightning {_short(x)}, {ours_name} {_short(y)}"
                     f"   [{counts[path]} occurrence(s)]")
    if len(first) > limit:
        lines.append(f"{label}: ... {len(first) - limit} more differing fields")
    return lines


def compare(lightning: RunRecord, ours: RunRecord, tol: Tolerance | None = None) -> list[str]:
    """Every difference, as report lines in order of importance (the first is the headline)."""
    tol = tol or TOLERANCES[lightning.processes]
    name = ours.trainer
    lines: list[str] = []
    if lightning.error:
        lines.append(f"LIGHTNING ITSELF FAILED (a corpus bug): {lightning.error}")
    if ours.error and ours.error != lightning.error:
        lines.append(f"{name} raised: {ours.error}")
    for rank in sorted(set(lightning.events) | set(ours.events)):
        a, b = lightning.events.get(rank, []), ours.events.get(rank, [])
        for stream in ("hooks", "logger"):
            label = f"{stream}[{'launching process' if rank == PARENT else f'rank {rank}'}]"
            lines += _first_sequence_difference(name, _stream(a, stream), _stream(b, stream), label)
            lines += _occurrence_differences(name, _stream(a, stream), _stream(b, stream), tol, label)
    for index, (x, y) in enumerate(zip(lightning.stages, ours.stages)):
        if lightning.processes > 1:
            x, y = _without_spawn_parent_state(x), _without_spawn_parent_state(y)
        found: list[tuple[str, Any, Any]] = []
        diff_values(x, y, f"stage[{index}] {x['call']}", tol, found)
        lines += [f"result: {p}: Lightning {_short(u)}, {name} {_short(v)}" for p, u, v in found[:20]]
    lines += _checkpoint_differences(lightning.checkpoints, ours.checkpoints, name, tol)
    if lightning.reload is not None:
        found = []
        diff_values(lightning.reload, ours.reload, "load_from_checkpoint", tol, found)
        lines += [f"reload: {p}: Lightning {_short(u)}, {name} {_short(v)}" for p, u, v in found[:10]]
    return lines


def _without_spawn_parent_state(stage: dict[str, Any]) -> dict[str, Any]:
    skipped = set(ORACLE_LIMITATIONS["spawn_parent_state"])
    if stage["call"].startswith("fit("):
        skipped.discard("weights")  # returned after fit
    kept = {k: v for k, v in stage.items() if k not in skipped}
    if isinstance(kept.get("checkpoint_callback"), dict):
        kept["checkpoint_callback"] = {k: v for k, v in kept["checkpoint_callback"].items()
                                       if f"checkpoint_callback.{k}" not in ORACLE_LIMITATIONS["spawn_parent_state"]}
    return kept


def _checkpoint_differences(a: dict[str, Any], b: dict[str, Any], name: str, tol: Tolerance) -> list[str]:
    lines = []
    if sorted(a) != sorted(b):
        lines.append(f"checkpoint files: Lightning {sorted(a)}, {name} {sorted(b)}")
    for path in sorted(set(a) & set(b)):
        x, y = a[path], b[path]
        # The meaningful entries Lightning wrote (one it leaves out, e.g. hyper_parameters of a module
        # without any, is not required of ours), the presence of callback state, and load errors.
        kept = [k for k in x if k in CHECKPOINT_KEYS] + ["has_callbacks", "load_error"]
        trimmed_x = {k: x.get(k, "<missing>") for k in kept if k in x or k in y}
        trimmed_y = {k: y.get(k, "<missing>") for k in kept if k in x or k in y}
        found: list[tuple[str, Any, Any]] = []
        diff_values(trimmed_x, trimmed_y, f"checkpoint {path}", tol, found)
        lines += [f"checkpoint: {p}: Lightning {_short(u)}, {name} {_short(v)}" for p, u, v in found[:12]]
    return lines


def checkpoint_key_notes(lightning: RunRecord, ours: RunRecord) -> list[str]:
    """Top-level checkpoint keys and callback state keys that differ: reported, not failed on."""
    notes = []
    for path in sorted(set(lightning.checkpoints) & set(ours.checkpoints)):
        x, y = lightning.checkpoints[path], ours.checkpoints[path]
        only_x = sorted(set(x.get("top_level_keys", [])) - set(y.get("top_level_keys", [])))
        only_y = sorted(set(y.get("top_level_keys", [])) - set(x.get("top_level_keys", [])))
        if only_x or only_y:
            notes.append(f"{path}: keys only in Lightning's {only_x}, only in ours {only_y}")
        if x.get("callback_keys") != y.get("callback_keys"):
            notes.append(f"{path}: callback state keys Lightning {x.get('callback_keys')}, "
                         f"ours {y.get('callback_keys')}")
    return notes


def format_report(case: str, lightning: RunRecord, ours: RunRecord, lines: list[str]) -> str:
    tol = TOLERANCES[lightning.processes]
    head = [f"conformance case {case!r} at {lightning.processes} process(es): {len(lines)} difference line(s); "
            f"floats compared with atol={tol.atol:g}, rtol={tol.rtol:g} (see compare.py)"]
    head += [f"allow-list applied to {ours.trainer}: {note}" for note in ours.notes]
    if lightning.processes > 1:
        head += [f"oracle limitation {name} (Lightning ddp_spawn), not compared: {', '.join(fields)}"
                 for name, fields in ORACLE_LIMITATIONS.items()]
    head += [f"note (not failed on): checkpoint {note}" for note in checkpoint_key_notes(lightning, ours)]
    return "\n".join(head + lines)


def assert_conformant(case: str, lightning: RunRecord, ours: RunRecord,
                      report: Callable[[str], None] | None = None) -> None:
    lines = compare(lightning, ours)
    text = format_report(case, lightning, ours, lines)
    if report is not None:
        report(text)
    if lines:
        raise AssertionError(text)
