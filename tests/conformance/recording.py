"""Recorders shared by every conformance case: one module wrapper, one callback, one logger.

Everything observable is appended, as one JSON line per event, to `<dir>/<run>.pid<PID>.jsonl`:
a file per process, because under DDP the hooks run in worker processes (Lightning's `ddp_spawn`
and our torch-elastic workers alike) and only files come back reliably from both. The
recording objects carry their `Recorder` as a plain attribute, so they pickle into workers.

An event is `{"stream", "src", "hook", "args", "data", "state"}`:
* `stream` "hooks" (module, DataModule and callback hooks, interleaved in call order) or
  "logger" (what a `Logger` receives);
* `args`: the discrete part of the arguments (ints, strings, shapes, "optimizer#0"): the call
  sequence is compared on `(src, hook, args)`;
* `data`: the numeric part (tensor sums, loss values, grad norms), compared with a tolerance
  at the same occurrence of the same hook;
* `state`: on callback hooks, a snapshot of the `trainer.*` values hooks read and the three
  metric dicts.
"""

from __future__ import annotations

import functools
import glob
import inspect
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

ABSENT = "<absent>"  # the Trainer has no such attribute (Lightning lacking one is not compared)
# The checkpoint entries whose meaning both Trainers share (compared; other keys are only noted).
CHECKPOINT_KEYS = ("epoch", "global_step", "state_dict", "optimizer_states", "lr_schedulers", "hyper_parameters")


# ---------------------------------------------------------------------- the sink
PARENT = -1  # the launching process of a multi-process run (its events are not any rank's)


class Recorder:
    """Appends events to one JSON-lines file per process under `directory`; `read()` regroups
    them by rank. A process's rank is the last one it reported: Lightning calls some hooks
    (configure_callbacks) in a spawned worker before it knows its rank. With `parent_pid`
    (multi-process runs), the launching process's own events go to rank `PARENT`, and its stage
    markers into every rank's stream."""

    def __init__(self, directory: str, run: str, parent_pid: int | None = None) -> None:
        self.directory, self.run, self.parent_pid = directory, run, parent_pid
        self.train_loader_requested = False  # in the stage now running (see `snapshot`)
        os.makedirs(directory, exist_ok=True)

    def write(self, event: dict[str, Any], rank: int | None = None) -> None:
        event.update(t=time.time_ns(), rank=current_rank() if rank is None else rank)
        path = os.path.join(self.directory, f"{self.run}.pid{os.getpid()}.jsonl")
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(event, default=_json_default) + "\n")

    def mark(self, stage: str) -> None:
        """A driver-side marker: "the test now calls trainer.<stage>"."""
        self.train_loader_requested = False
        self.write({"stream": "hooks", "src": "driver", "hook": stage, "args": {}, "data": {}, "state": None})

    def read(self) -> dict[int, list[dict[str, Any]]]:
        streams: dict[int, list[dict[str, Any]]] = {}
        markers: list[dict[str, Any]] = []
        for path in glob.glob(os.path.join(self.directory, f"{self.run}.pid*.jsonl")):
            pid = int(path.rsplit(".pid", 1)[1].split(".")[0])
            with open(path, encoding="utf-8") as handle:
                events = [json.loads(line) for line in handle if line.strip()]
            if not events:
                continue
            for before, event in zip(events, events[1:]):  # keep a process's own order if the clock steps back
                event["t"] = max(event["t"], before["t"])
            rank = PARENT if pid == self.parent_pid else events[-1]["rank"]
            markers += [e for e in events if e["src"] == "driver"]
            streams.setdefault(rank, []).extend(e for e in events if e["src"] != "driver")
        if not streams:
            streams[0] = []
        for rank, events in streams.items():
            if rank != PARENT or len(streams) == 1:
                events.extend(dict(marker) for marker in markers)
            events.sort(key=lambda e: e["t"])
            for event in events:
                del event["t"], event["rank"]
        return {rank: events for rank, events in streams.items() if events}

    def hook(self, src: str, name: str, trainer: Any, module: Any, bound: Mapping[str, Any],
             with_state: bool = False) -> None:
        args, data = {}, {}
        for key, value in bound.items():
            args[key], item = describe(value, trainer)
            if item is not None:
                data[key] = item
        data.update(_probes(name, module))
        self.train_loader_requested |= name == "train_dataloader"
        state = snapshot(trainer, module, self.train_loader_requested) if with_state and trainer is not None else None
        self.write({"stream": "hooks", "src": src, "hook": name, "args": args, "data": data, "state": state},
                   rank=_rank_of(trainer))


def _rank_of(trainer: Any) -> int | None:
    rank = getattr(trainer, "global_rank", None) if trainer is not None else None
    return rank if isinstance(rank, int) else None


def current_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _json_default(value: Any) -> Any:
    return repr(value)


# ---------------------------------------------------------------------- argument summaries
def describe(value: Any, trainer: Any) -> tuple[Any, Any]:
    """(discrete summary, numeric summary or None) of one hook argument."""
    if value is None or isinstance(value, (bool, int, str)):
        return _plain(value), None
    if isinstance(value, float):
        return "float", value
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        total = float(value.detach().double().sum()) if value.numel() else 0.0
        return f"T{tuple(value.shape)}:{dtype}", total
    if isinstance(value, torch.device):
        return f"device:{value.type}", None
    if isinstance(value, BaseException):
        return f"exception:{type(value).__name__}", None
    if isinstance(value, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)):
        return f"scheduler#{_scheduler_index(trainer, value)}", None
    if isinstance(value, torch.optim.Optimizer):
        return f"optimizer#{_index_in(trainer, 'optimizers', _unwrap_optimizer(value))}", None
    if isinstance(value, torch.nn.Module):
        return f"module:{type(value).__name__}", None
    if isinstance(value, Mapping):
        if "state_dict" in value and "epoch" in value:
            # A checkpoint dict: which of the meaningful keys it has, and its position. All its
            # top-level keys are compared on the files instead, as a note (formats may differ).
            # Lightning writes hyper_parameters only when there are any: compare "has non-empty ones".
            present = {key: key in value for key in CHECKPOINT_KEYS if key != "hyper_parameters"}
            return "checkpoint", {**present, "hyper_parameters": bool(value.get("hyper_parameters")),
                                  "epoch": value.get("epoch"), "global_step": value.get("global_step")}
        pairs = {str(k): describe(v, trainer) for k, v in value.items()}
        return {k: d for k, (d, _) in pairs.items()}, _numeric({k: n for k, (_, n) in pairs.items()})
    if isinstance(value, (list, tuple)):
        pairs_list = [describe(v, trainer) for v in value]
        return [d for d, _ in pairs_list], _numeric([n for _, n in pairs_list])
    if callable(value):
        return "callable", None
    return f"object:{type(value).__name__}", None


def _plain(value: Any) -> Any:
    """Enums that subclass str (Lightning's TrainerFn/RunningStage) become their value."""
    return getattr(value, "value", value) if isinstance(value, str) else value


def _numeric(value: Any) -> Any:
    if isinstance(value, dict):
        kept = {k: v for k, v in value.items() if v is not None}
        return kept or None
    if isinstance(value, list):
        return value if any(v is not None for v in value) else None
    return value


def _unwrap_optimizer(value: Any) -> Any:
    """The torch optimizer behind Lightning's LightningOptimizer or our own wrapper (both
    present themselves as subclasses of the optimizer's class, so look inside first)."""
    for _ in range(3):
        attributes = getattr(value, "__dict__", {})
        inner = attributes.get("_optimizer") or attributes.get("optimizer")
        if not isinstance(inner, torch.optim.Optimizer):
            break
        value = inner
    return value if isinstance(value, torch.optim.Optimizer) else None


def _index_in(trainer: Any, attribute: str, value: Any) -> int | None:
    if value is None or trainer is None:
        return None
    try:
        items = list(getattr(trainer, attribute) or [])
    except Exception:  # noqa: BLE001 - a Trainer mid-setup may not have them yet
        return None
    for index, item in enumerate(items):
        if _unwrap_optimizer(item) is value:
            return index
    return None


def _scheduler_index(trainer: Any, value: Any) -> int | None:
    try:
        configs = list(getattr(trainer, "lr_scheduler_configs", []) or [])
    except Exception:  # noqa: BLE001
        return None
    for index, config in enumerate(configs):
        if getattr(config, "scheduler", None) is value:
            return index
    return None


# ---------------------------------------------------------------------- probes and snapshots
# Hooks at which a module's buffers (BatchNorm running statistics) are summed, per buffer and per
# rank: before an evaluation loop's first forward (each rank's own statistics), after it (what
# the buffer broadcast left), and at the end of training. Only modules that have buffers.
_BUFFER_PROBE_HOOKS = ("on_validation_start", "on_validation_end", "on_train_end")


def _probes(hook: str, module: Any) -> dict[str, Any]:
    """Numbers that show what the optimizer step saw: the gradient norm before the step
    (before clipping, where Lightning calls on_before_optimizer_step) and the weights after;
    and, at `_BUFFER_PROBE_HOOKS`, the module's buffers."""
    if not isinstance(module, torch.nn.Module):
        return {}
    if hook in _BUFFER_PROBE_HOOKS:
        buffers = {name: float(b.detach().double().sum()) for name, b in module.named_buffers()}
        return {"buffer_sums": buffers} if buffers else {}
    params = list(module.parameters())
    if hook == "on_before_optimizer_step":
        grads = [p.grad.detach().double() for p in params if p.grad is not None]
        return {"grad_norm": float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0}
    if hook in ("on_before_zero_grad", "on_train_batch_end", "on_train_epoch_end"):
        return {"param_sum": float(sum(p.detach().double().sum() for p in params)) if params else 0.0}
    return {}


_STATE_ATTRIBUTES = ("global_step", "current_epoch", "num_training_batches", "num_val_batches",
                     "num_sanity_val_batches", "num_test_batches", "num_predict_batches", "sanity_checking",
                     "training", "validating", "testing", "predicting", "should_stop", "is_last_batch",
                     "world_size", "global_rank", "is_global_zero")


def snapshot(trainer: Any, module: Any, train_loader_requested: bool = True) -> dict[str, Any]:
    """The `trainer.*` values hooks commonly read, the learning rates and the metric dicts."""
    state: dict[str, Any] = {name: _read(trainer, name) for name in _STATE_ATTRIBUTES}
    status = getattr(trainer, "state", None)
    state["state.fn"] = _plain(getattr(status, "fn", ABSENT))
    state["state.stage"] = _plain(getattr(status, "stage", ABSENT))
    if state["state.fn"] == "fit" and isinstance(state["num_training_batches"], int) and train_loader_requested:
        # Only once this stage has loaded the training loader: before that, reading the estimate makes
        # either Trainer load it early (in a second fit, the count left by the first is an int already),
        # and the recorder would change the call sequence it records.
        state["estimated_stepping_batches"] = _read(trainer, "estimated_stepping_batches")
    state["module.training"] = bool(getattr(module, "training", False))
    state["grad_enabled"] = torch.is_grad_enabled()
    state["inference_mode"] = torch.is_inference_mode_enabled()
    optimizers = _read(trainer, "optimizers")
    unwrapped = [_unwrap_optimizer(o) for o in optimizers] if isinstance(optimizers, list) else []
    state["lr"] = [[group["lr"] for group in o.param_groups] for o in unwrapped if o is not None] \
        if isinstance(optimizers, list) else optimizers
    for name in ("callback_metrics", "logged_metrics", "progress_bar_metrics"):
        state[name] = metric_dict(_read(trainer, name))
    return state


def _read(trainer: Any, name: str) -> Any:
    try:
        value = getattr(trainer, name)
    except AttributeError:
        return ABSENT
    except Exception as error:  # noqa: BLE001 - recorded, so a raising property shows up as a difference
        return f"<error: {type(error).__name__}>"
    if isinstance(value, (bool, int, str)) or value is None:
        return _plain(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return [v if math.isfinite(v) else str(v) for v in value]
    return value


def metric_dict(metrics: Any) -> Any:
    """{name: float} (or a list for a non-scalar tensor) of a metrics mapping."""
    if not isinstance(metrics, Mapping):
        return metrics if isinstance(metrics, str) else repr(metrics)
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            out[str(key)] = float(value) if value.numel() == 1 else value.detach().double().flatten().tolist()
        elif isinstance(value, (int, float)):
            out[str(key)] = float(value)
        else:
            out[str(key)] = repr(value)
    return out


# ---------------------------------------------------------------------- the module and DataModule wrappers
# Hooks Lightning calls whether or not they are overridden: wrapping them changes nothing.
_NOTIFICATION_HOOKS = ("setup", "teardown", "configure_callbacks", "on_save_checkpoint", "on_load_checkpoint")
# Wrapped only where the user's class defines them: Lightning (and ours, possibly) decides what to run by
# whether they are overridden (`is_overridden`), so wrapping a default would change the behaviour under test.
_IF_OVERRIDDEN = ("prepare_data", "configure_model", "configure_optimizers", "training_step", "validation_step",
                  "test_step", "predict_step", "train_dataloader", "val_dataloader", "test_dataloader",
                  "predict_dataloader", "on_before_batch_transfer", "transfer_batch_to_device",
                  "on_after_batch_transfer", "configure_gradient_clipping", "optimizer_step", "optimizer_zero_grad",
                  "lr_scheduler_step", "backward", "state_dict", "load_state_dict")


def _wrap(src: str, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = self.__dict__.get("_conformance_recorder")
        if recorder is not None:
            try:
                bound = signature.bind(self, *args, **kwargs)
                bound.apply_defaults()
                arguments = {k: v for k, v in bound.arguments.items() if k not in ("self", "args", "kwargs")}
            except TypeError:
                arguments = {"unbindable": f"{len(args)} args, {sorted(kwargs)}"}
            trainer = _trainer_of(self)
            recorder.hook(src, name, trainer, self if src == "module" else None, arguments)
        return original(self, *args, **kwargs)

    return hook


def _trainer_of(obj: Any) -> Any:
    try:
        return getattr(obj, "trainer", None)
    except Exception:  # noqa: BLE001 - Lightning raises when the module is not attached
        return None


def recorded(cls: type, base: type, src: str = "module") -> type:
    """A subclass of `cls` that records every hook call and then runs `cls`'s own code unchanged.

    `base` is Lightning's `LightningModule` (or `LightningDataModule`): its hooks are wrapped
    when they are notifications, the others only where `cls` overrides them. The class is
    named `Recorded<cls>` in `cls`'s module; the caller binds it there so it pickles."""
    hook_names = set(_IF_OVERRIDDEN) | set(_NOTIFICATION_HOOKS)
    hook_names |= {name for name in dir(base) if name.startswith("on_") and callable(getattr(base, name))}
    namespace: dict[str, Any] = {"__module__": cls.__module__}
    for name in sorted(hook_names):
        original = getattr(cls, name, None)
        if not callable(original):
            continue
        overridden = original is not getattr(base, name, None)
        if name in _IF_OVERRIDDEN and not overridden:
            continue
        namespace[name] = _wrap(src, name, original)
    name = f"Recorded{cls.__name__}"
    new = type(name, (cls,), namespace)
    new.__qualname__ = name
    return new


def attach_recorder(obj: Any, recorder: Recorder | None) -> Any:
    obj.__dict__["_conformance_recorder"] = recorder
    return obj


# ---------------------------------------------------------------------- callback and logger, per package
def recording_callback_class(callback_base: type) -> type:
    """A `Callback` subclass (of `pytorch_lightning` or `lightning.pytorch`) recording every hook."""
    names = [n for n, _ in inspect.getmembers(callback_base, inspect.isfunction)
             if (n.startswith("on_") or n in ("setup", "teardown"))]

    def init(self: Any, recorder: Recorder) -> None:
        callback_base.__init__(self)  # type: ignore[misc]
        self.recorder = recorder

    namespace: dict[str, Any] = {"__init__": init, "__module__": __name__}
    for name in names:
        namespace[name] = _callback_hook(name, inspect.signature(getattr(callback_base, name)))
    return type("RecordingCallback", (callback_base,), namespace)


def _callback_hook(name: str, signature: inspect.Signature) -> Callable[..., Any]:
    def hook(self: Any, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, trainer, pl_module, *args, **kwargs)
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items() if k not in ("self", "trainer", "pl_module")}
        self.recorder.hook("callback", name, trainer, pl_module, arguments, with_state=True)

    hook.__name__ = hook.__qualname__ = name
    return hook


def recording_logger_class(logger_base: type, rank_zero_only: Callable[..., Any]) -> type:
    """A `Logger` subclass that records the rows (and their step), hyperparameters and finalize."""

    def init(self: Any, recorder: Recorder) -> None:
        logger_base.__init__(self)  # type: ignore[misc]
        self.recorder = recorder

    def write(self: Any, hook: str, args: dict[str, Any], data: Any) -> None:
        self.recorder.write({"stream": "logger", "src": "logger", "hook": hook, "args": args, "data": data,
                             "state": None})

    @rank_zero_only
    def log_metrics(self: Any, metrics: Mapping[str, Any], step: int | None = None) -> None:
        write(self, "log_metrics", {"step": step, "keys": sorted(metrics)}, metric_dict(metrics))

    @rank_zero_only
    def log_hyperparams(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        plain = dict(params) if isinstance(params, Mapping) else vars(params)
        write(self, "log_hyperparams", {"keys": sorted(map(str, plain))}, {str(k): repr(v) for k, v in plain.items()})

    @rank_zero_only
    def finalize(self: Any, status: str) -> None:
        write(self, "finalize", {"status": _plain(status)}, None)

    @rank_zero_only
    def after_save_checkpoint(self: Any, checkpoint_callback: Any) -> None:
        write(self, "after_save_checkpoint", {"callback": checkpoint_callback.__class__.__name__}, None)

    namespace = {"__init__": init, "__module__": __name__, "log_metrics": log_metrics,
                 "log_hyperparams": log_hyperparams, "finalize": finalize,
                 "after_save_checkpoint": after_save_checkpoint,
                 "name": property(lambda self: "conformance"), "version": property(lambda self: 0)}
    return type("RecordingLogger", (logger_base,), namespace)


def _lightning_classes(package: str) -> tuple[type, type]:
    if package == "pytorch_lightning":
        import pytorch_lightning as pl
        from pytorch_lightning.loggers import Logger
        from pytorch_lightning.utilities import rank_zero_only
    else:
        import lightning.pytorch as pl  # type: ignore[no-redef]
        from lightning.pytorch.loggers import Logger  # type: ignore[no-redef, assignment]
        from lightning.pytorch.utilities import rank_zero_only  # type: ignore[no-redef]
    return recording_callback_class(pl.Callback), recording_logger_class(Logger, rank_zero_only)


# Module-level names, so the instances pickle into worker processes.
RecordingCallback, RecordingLogger = _lightning_classes("pytorch_lightning")
RecordingCallback.__qualname__ = RecordingCallback.__name__ = "RecordingCallback"
RecordingLogger.__qualname__ = RecordingLogger.__name__ = "RecordingLogger"
UnifiedRecordingCallback, UnifiedRecordingLogger = _lightning_classes("lightning.pytorch")
UnifiedRecordingCallback.__qualname__ = UnifiedRecordingCallback.__name__ = "UnifiedRecordingCallback"
UnifiedRecordingLogger.__qualname__ = UnifiedRecordingLogger.__name__ = "UnifiedRecordingLogger"

RECORDERS = {"pytorch_lightning": (RecordingCallback, RecordingLogger),
             "lightning.pytorch": (UnifiedRecordingCallback, UnifiedRecordingLogger)}
