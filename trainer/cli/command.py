"""`ddp-train` (also `python -m trainer`): compose `conf/` with Hydra, validate, build, fit.

Hydra stays at this edge: the Trainer, strategies, modules and callbacks receive plain
Python values. A bad config fails here, before any worker starts, with one line on stderr
naming the key and exit code 2 (`HYDRA_FULL_ERROR=1` shows the full trace instead).

Under torchrun or srun every rank runs this command; they share one output directory named
after the launcher's job id, and only rank 0 writes Hydra's files (`.hydra/`, the log).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import hydra
from hydra.errors import HydraException, InstantiationException
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from strategies.environment import detect_environment, processes_launched_externally
from trainer import Trainer, seed_everything
from strategies.launcher import WorkerFailedError
from strategies.preemption import PREEMPTED_EXIT_CODE, Preempted
from trainer.cli.checks import validate
from trainer.cli.errors import ConfigError, describe_error
from trainer.cli.run_dir import output_dir
from trainer.cli.schemas import config_dir
from trainer.loggers import TensorBoardLogger

PROG = "ddp-train"
EXIT_CONFIG_ERROR = 2
EXIT_WORKER_FAILED = 1


_user_full_error = False  # HYDRA_FULL_ERROR=1 as the user set it (main() sets it for Hydra)


def main() -> None:
    """Console-script entry point."""
    global _user_full_error
    sys.argv[1:] = [*sys.argv[1:], *rank_overrides(sys.argv[1:])]
    _user_full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Hydra prints multi-line reports unless HYDRA_FULL_ERROR is set; set it so errors reach
    # us as exceptions, and print our own one line unless the user asked for the full trace.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _hydra_main()
    except (ConfigError, HydraException, OmegaConfBaseException) as error:
        exit_with_config_error(error)
    except WorkerFailedError as error:
        # The failing rank's number and traceback are the message; our own stack adds nothing.
        print(f"{PROG}: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_WORKER_FAILED)
    except Preempted as notice:
        print(f"{PROG}: {notice}; rerun the same command (same run directory) to resume.", file=sys.stderr, flush=True)
        sys.exit(PREEMPTED_EXIT_CODE)
    finally:
        if not _user_full_error:
            os.environ.pop("HYDRA_FULL_ERROR", None)


def exit_with_config_error(error: BaseException) -> NoReturn:
    """Print the one line and exit 2 (or re-raise when HYDRA_FULL_ERROR=1 asked for the trace).
    Called inside a job too, so a multirun stops at the first bad config."""
    if _user_full_error:
        raise error
    print(f"{PROG}: config error: {describe_error(error)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG_ERROR)


def rank_overrides(argv: list[str]) -> list[str]:
    """Extra overrides for ranks > 0 of an external launch: no `.hydra/` and no log file."""
    if not processes_launched_externally() or detect_environment().global_rank == 0:
        return []
    extra = ["hydra.output_subdir=null"]
    if not any(arg.lstrip("+~").startswith("hydra/job_logging") for arg in argv):
        extra.append("hydra/job_logging=stdout")
    return extra


class ValidateConfig(Callback):
    """Hydra callback (conf/hydra/default.yaml): validate before Hydra creates the run
    directory, so a typo leaves no empty `outputs/...` behind. It exits rather than raises:
    Hydra turns a callback's exception into a warning. Multirun jobs are validated in `run`,
    once their sweep values are known."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            validate(config)
        except ConfigError as error:
            exit_with_config_error(error)


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    try:
        return run(cfg)
    except (ConfigError, OmegaConfBaseException) as error:  # here, not in main: Hydra would add a line
        exit_with_config_error(error)


def run(cfg: DictConfig) -> float | None:
    """One job: validate, build everything, fit, report. Returns the monitored metric (what a
    Hydra sweeper optimises), or None when it was not logged."""
    validate(cfg)
    seed_everything(cfg.seed)
    datamodule, model, trainer = build(cfg)
    started = time.monotonic()
    trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    if trainer.is_global_zero:
        print(summary(trainer, output_dir(cfg), time.monotonic() - started))
    value = trainer.callback_metrics.get(cfg.monitor.metric)
    return None if value is None else float(value)


def build(cfg: DictConfig) -> tuple[Any, Any, Any]:
    """Instantiate datamodule, model, strategy, callbacks, loggers and the Trainer, in the
    parent process. Every constructor error becomes a one-line ConfigError naming its group."""
    datamodule = construct("data", cfg.data)
    model_node, unfilled = fill_from_data(cfg.model, datamodule)
    model = construct("model", model_node, unfilled=unfilled)
    strategy = construct("strategy", cfg.strategy)
    wanted = {name: node for name, node in (cfg.callbacks or {}).items() if node}
    if not cfg.trainer.get("enable_telemetry", True):
        wanted.pop("telemetry", None)  # trainer.enable_telemetry=false turns telemetry off, logger rows included
    callbacks = [construct(f"callbacks.{name}", node) for name, node in wanted.items()]
    loggers = [construct(f"logger.{name}", node) for name, node in (cfg.logger or {}).items() if node]
    kwargs: dict[str, Any] = OmegaConf.to_container(cfg.trainer, resolve=True)  # type: ignore[assignment]
    logger: Any = loggers[0] if len(loggers) == 1 else (loggers or False)
    trainer = _call("trainer", lambda: Trainer(**kwargs, strategy=strategy, callbacks=callbacks, logger=logger,
                                                default_root_dir=output_dir(cfg)))
    return datamodule, model, trainer


def fill_from_data(node: DictConfig, datamodule: Any) -> tuple[dict[str, Any], list[str]]:
    """The model config as a dict, null keys taken from same-named datamodule attributes
    (vocab_size, input_dim, ...): values that depend on the data live in one place."""
    values: dict[str, Any] = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    unfilled = []
    for key, value in values.items():
        if value is not None or key.startswith("_"):
            continue
        provided = _call("data", lambda: getattr(datamodule, key, None))  # may read the data file
        if provided is None:
            unfilled.append(key)
        else:
            values[key] = provided
    return values, unfilled


def construct(key: str, node: DictConfig | dict[str, Any], unfilled: list[str] | None = None) -> Any:
    """`instantiate` with plain containers for arguments (`_convert_="all"`: no DictConfig leaks)."""
    return _call(key, lambda: instantiate(node, _convert_="all"), unfilled)


def _call(key: str, build_fn: Callable[[], Any], unfilled: list[str] | None = None) -> Any:
    """Run a constructor; its error becomes a ConfigError naming `key` (and, when the message
    mentions one, the null keys the datamodule could not fill)."""
    try:
        return build_fn()
    except (InstantiationException, ValueError, TypeError, OSError, ImportError) as error:
        message = describe_error(error)
        missing = [name for name in unfilled or [] if name in message]
        if missing:
            message += f" ({key}.{missing[0]} is null and the datamodule has no `{missing[0]}` to fill it)"
        # Chained, so HYDRA_FULL_ERROR=1 still shows the constructor's own traceback.
        raise ConfigError(key, expected=message) from error


def summary(trainer: Trainer, run_dir: str, seconds: float) -> str:
    """What a user wants after a run: the final metrics, the best checkpoint, where to look."""
    metrics = {name: float(value) for name, value in sorted(trainer.callback_metrics.items())
               if getattr(value, "numel", lambda: 1)() == 1}
    lines = [f"{PROG}: finished in {seconds:.1f} s on {trainer.world_size} process(es), "
             f"epoch {trainer.current_epoch}, step {trainer.global_step}"]
    lines.append("  metrics:   " + ("  ".join(f"{k}={v:.4f}" for k, v in metrics.items()) or "(none logged)"))
    checkpoint = trainer.checkpoint_callback
    best = getattr(checkpoint, "best_model_path", "") if checkpoint is not None else ""
    lines.append(f"  best ckpt: {best or '(none saved)'}")
    lines.append(f"  run dir:   {run_dir}")
    if any(isinstance(logger, TensorBoardLogger) for logger in trainer.loggers):
        lines.append(f"  tensorboard --logdir {run_dir}")
    return "\n".join(lines)
