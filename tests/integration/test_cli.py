"""`ddp-train`'s configs: every preset composes and validates; bad input is one line, exit 2.

Composition runs in-process through Hydra's compose API; the command-line behaviour (exit
codes, stderr, working from any directory) runs as real subprocesses, started together so
the whole file stays quick on a small machine.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

import trainer
from strategies import DDPStrategy, SingleDeviceStrategy
from strategies.checkpoint_io import CheckpointError
from trainer import Trainer
from trainer.checkpointing import require_checkpoint_file
from trainer.cli import command as cli
from trainer.cli.checks import validate
from trainer.cli.errors import ConfigError
from trainer.cli.run_dir import run_name
from trainer.precision import normalize_precision

PRESETS = [
    [],
    ["model=digits_cnn"],
    ["experiment=char_gpt"],
    ["experiment=synthetic_regression"],
    ["data=synthetic"],
    ["strategy=single", "trainer.devices=1"],
    ["trainer=fast", "logger=[tensorboard,csv]", "callbacks=none"],
    ["logger=none", "trainer.precision=bf16", "strategy.comm_hook=fp16"],
]


@pytest.fixture(scope="module")
def hydra_context() -> Iterator[None]:
    with initialize_config_dir(config_dir=cli.config_dir(), version_base="1.3"):
        yield


def compose_cfg(overrides: list[str]) -> DictConfig:
    return compose(config_name="config", overrides=[*overrides, "paths.output_dir=/tmp/unused"])


@pytest.mark.parametrize("overrides", PRESETS, ids=lambda o: " ".join(o) or "defaults")
def test_presets_compose_and_validate(hydra_context: None, overrides: list[str]) -> None:
    cfg = compose_cfg(overrides)
    validate(cfg)
    assert OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


def test_defaults_are_the_documented_job(hydra_context: None) -> None:
    cfg = compose_cfg([])
    assert cfg.model._target_ == "trainer.demos.digits.DigitsClassifier" and cfg.model.arch == "mlp"
    assert cfg.strategy._target_ == "strategies.DDPStrategy"
    assert (cfg.trainer.devices, cfg.trainer.precision, cfg.seed) == (2, "32-true", 42)
    assert cfg.callbacks.model_checkpoint.monitor == "val_acc" and cfg.callbacks.model_checkpoint.mode == "max"


def test_model_sizes_come_from_the_data(hydra_context: None) -> None:
    cfg = compose_cfg(["experiment=char_gpt", "data.block_size=16", "model.n_layer=1"])
    datamodule = cli.construct("data", cfg.data)
    values, unfilled = cli.fill_from_data(cfg.model, datamodule)
    assert unfilled == ["scheduler"] or unfilled == []
    assert values["vocab_size"] == datamodule.vocab_size and values["block_size"] == 16
    model = cli.construct("model", values)
    assert model.hparams.vocab_size == datamodule.vocab_size
    assert type(model.hparams.vocab_size) is int  # plain values, never a DictConfig


def test_multirun_sweeps_compose(hydra_context: None) -> None:
    """Each job of `ddp-train -m model=digits_mlp,digits_cnn trainer.max_epochs=1,3` composes."""
    parsed = OverridesParser.create().parse_overrides(["model=digits_mlp,digits_cnn", "trainer.max_epochs=1,3"])
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] for o in parsed]
    jobs = list(itertools.product(*choices))
    assert len(jobs) == 4
    for job in jobs:
        cfg = compose_cfg(list(job))
        validate(cfg)
        assert cfg.trainer.max_epochs in (1, 3)


@pytest.mark.parametrize(("overrides", "key"), [
    (["trainer.max_epochs=abc"], "trainer.max_epochs"),
    (["trainer.foo=1"], "trainer.foo"),
    (["model.lr=fast"], "model.lr"),
    (["strategy.first_bucket_cap_mb=big"], "strategy.first_bucket_cap_mb"),
])
def test_schemas_reject_types_and_unknown_keys(hydra_context: None, overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigCompositionException) as caught:
        compose_cfg(overrides)
    assert key in cli.describe_error(caught.value)


def test_bad_group_choice_lists_the_options(hydra_context: None) -> None:
    with pytest.raises(MissingConfigException) as caught:
        compose_cfg(["model=nosuchmodel"])
    assert cli.describe_error(caught.value) == (
        "model='nosuchmodel' is not one of ['char_gpt', 'digits_cnn', 'digits_mlp', 'mlp_regressor']")


def test_group_list_choice_and_data_errors_are_one_line(hydra_context: None) -> None:
    with pytest.raises(MissingConfigException) as caught:
        compose_cfg(["logger=[tensorboard,nope]"])
    assert cli.describe_error(caught.value) == "logger='nope' is not one of ['csv', 'none', 'tensorboard']"
    cfg = compose_cfg(["experiment=char_gpt", "data.path=/no/such/file.txt"])
    datamodule = cli.construct("data", cfg.data)
    with pytest.raises(ConfigError, match=r"^data: text file '/no/such/file.txt' does not exist \(data.path\)$"):
        cli.fill_from_data(cfg.model, datamodule)


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.precision=17-bits"], "trainer.precision='17-bits' is not one of ['32-true'"),
    (["trainer.accelerator=tpu"], "trainer.accelerator='tpu' is not one of ['cpu', 'cuda', 'gpu', 'auto']"),
    (["trainer.devices=0"], "trainer.devices=0 must be an int >= 1"),
    (["trainer.num_nodes=-1"], "trainer.num_nodes=-1 must be an int >= 1"),
    (["trainer.max_epochs=-2"], "trainer.max_epochs=-2 must be an int >= -1"),
    (["trainer.limit_train_batches=1.5"], "trainer.limit_train_batches=1.5 must be a float in [0.0, 1.0]"),
    (["trainer.gradient_clip_algorithm=l3"], "trainer.gradient_clip_algorithm='l3' is not one of"),
    (["strategy=single"], "strategy: SingleDeviceStrategy runs one process on one device, but devices=2 and "
                          "num_nodes=1 were requested; use strategy='ddp'"),
    (["strategy.comm_hook=fp8"], "strategy.comm_hook='fp8' is not one of ['bf16', 'fp16', 'mean'], None"),
    (["strategy.transport=tcp"], "strategy.transport='tcp' is not one of ['auto', 'shared_memory', 'process_group']"),
    (["strategy.start_method=fork"], "strategy.start_method='fork' is not one of ['forkserver', 'spawn']"),
    (["strategy.bucket_cap_mb=big"], "strategy.bucket_cap_mb='big' must be a number of MiB > 0 or 'auto'"),
    (["strategy.bucket_cap_mb=0"], "strategy.bucket_cap_mb=0 must be a number of MiB > 0 or 'auto'"),
    (["strategy.zero_stage=3"], "strategy.zero_stage=3 is not one of [0, 1, 2]"),
    (["seed=-1"], "seed=-1 must be an int >= 0"),
    (["monitor.mode=best"], "monitor.mode='best' is not one of ['min', 'max']"),
    (["callbacks.lr_monitor.logging_interval=step", "~callbacks.lr_monitor._target_"], "callbacks.lr_monitor="),
])
def test_validate_names_key_value_and_choices(hydra_context: None, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate(compose_cfg(overrides))
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("bad", [
    {"devices": 0}, {"max_epochs": -2}, {"limit_val_batches": 2.5}, {"val_check_interval": 0},
    {"log_every_n_steps": -1}, {"gradient_clip_val": -1.0}, {"num_sanity_val_steps": -2}, {"fast_dev_run": -1},
    {"check_val_every_n_epoch": None, "val_check_interval": 0.5}, {"precision": "17-bits"}, {"accelerator": "tpu"},
])
def test_the_cli_reports_the_trainers_own_check(hydra_context: None, bad: dict[str, object]) -> None:
    """One home per rule: a bad trainer.* value fails in `validate` with the message `Trainer(...)` raises
    for the same value, with the key's group in front."""
    overrides = [f"trainer.{key}={'null' if value is None else value}" for key, value in bad.items()]
    with pytest.raises(ConfigError) as from_cli:
        validate(compose_cfg(overrides))
    with pytest.raises((ValueError, TypeError)) as from_trainer:
        Trainer(**bad)  # type: ignore[arg-type]
    assert str(from_cli.value) == "trainer." + str(from_trainer.value).rstrip(".")


@pytest.mark.parametrize(("overrides", "home"), [
    (["strategy=single"], lambda: SingleDeviceStrategy().configure(accelerator="cpu", devices=2, num_nodes=1)),
    (["strategy.sync_batchnorm=true"], lambda: DDPStrategy(sync_batchnorm=True).configure(accelerator="cpu", devices=2)),
    (["ckpt_path=/no/such.ckpt"], lambda: require_checkpoint_file("/no/such.ckpt", keywords=("last",))),
], ids=["one-device-one-process", "sync-batchnorm-needs-cuda", "checkpoint-exists"])
def test_the_cli_reports_the_rules_own_check(hydra_context: None, overrides: list[str],
                                             home: Callable[[], None]) -> None:
    """One home per rule: the strategy's (constructor and `configure`) and the checkpoint check's own
    message, in one line that starts with the key."""
    with pytest.raises(ConfigError) as from_cli:
        validate(compose_cfg(overrides))
    with pytest.raises((ValueError, CheckpointError)) as from_home:
        home()
    message = str(from_home.value).rstrip(".")
    assert str(from_cli.value) in (f"strategy: {message}", f"strategy.{message}", message)


def test_precision_aliases() -> None:
    assert [normalize_precision(v) for v in (32, "64", 16, "bf16", "bf16-mixed")] == [
        "32-true", "64-true", "16-mixed", "bf16-mixed", "bf16-mixed"]


def test_external_launch_shares_one_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DDP_TRAINER_LOCAL_WORKER", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert run_name("2024-01-01/10-00-00") == "2024-01-01/10-00-00"
    assert cli.rank_overrides([]) == []
    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc123"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    assert run_name("ignored") == "torchrun-abc123"
    assert cli.rank_overrides([]) == ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    monkeypatch.setenv("RANK", "0")
    assert cli.rank_overrides([]) == []
    for name in torchrun:
        monkeypatch.delenv(name)
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "777", "SLURM_STEP_ID": "2",
             "SLURM_JOB_NAME": "train"}
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    assert run_name("ignored") == "slurm-777.2"
    assert "hydra.output_subdir=null" in cli.rank_overrides([])


def test_config_dir_is_shipped_in_the_package() -> None:
    packaged = Path(trainer.__file__).parent / "conf" / "config.yaml"
    assert Path(cli.config_dir(), "config.yaml").is_file()
    assert packaged.is_file(), "trainer/conf must exist (a link to conf/ in a checkout) so wheels ship it"


# ---------------------------------------------------------------------- the command line
BAD_INPUTS = {
    "model=nosuchmodel": "model='nosuchmodel' is not one of ['char_gpt', 'digits_cnn', 'digits_mlp', 'mlp_regressor']",
    "trainer.foo=1": "trainer.foo is not a known key",
    "trainer.max_epochs=abc": "trainer.max_epochs='abc' is not a valid integer",
    "trainer.precision=17-bits": "trainer.precision='17-bits' is not one of",
    "experiment=char_gpt data.path=/no/such/file.txt": "data: text file '/no/such/file.txt' does not exist",
    "strategy.preemption.signals=[SIGFOO]": "strategy: preemption signal 'SIGFOO' is not a signal of this platform",
}


def start(args: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    environment = {name: value for name, value in os.environ.items() if name != "HYDRA_FULL_ERROR"}
    environment.update(OMP_NUM_THREADS="1", **env)
    return subprocess.Popen([sys.executable, "-m", "trainer", *args], cwd=cwd, env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.timeout(240)
@pytest.mark.conformance
def test_command_line_errors_and_introspection(tmp_path: Path) -> None:
    """Bad input: exit 2, one stderr line naming the key, no run directory (composition and
    validation fail before Hydra makes one). Also: HYDRA_FULL_ERROR=1 keeps the trace, and a
    user's own --config-dir adds a model (`--cfg job` prints it)."""
    early, late = tmp_path / "early", tmp_path / "late"
    for folder in (early, late, tmp_path / "my_conf" / "model"):
        folder.mkdir(parents=True)
    (tmp_path / "my_conf" / "model" / "tiny.yaml").write_text(
        "_target_: trainer.demos.synthetic.MLPRegressor\nhidden_sizes: [4]\n")
    # data.path is checked when the datamodule is built, inside the run: use its own folder.
    procs = {args: start(args.split(), late if "data.path" in args else early) for args in BAD_INPUTS}
    procs["FULL"] = start(["trainer.precision=17-bits"], late, HYDRA_FULL_ERROR="1")
    procs["USER"] = start(["--config-dir", str(tmp_path / "my_conf"), "model=tiny", "--cfg", "job"], early)
    results = {name: (proc.wait(timeout=200), *proc.communicate()) for name, proc in procs.items()}
    for args, expected in BAD_INPUTS.items():
        code, out, err = results[args]
        assert code == 2, (args, err)
        assert err.count("\n") == 1 and err.startswith("ddp-train: config error: "), (args, err)
        assert expected in err, (args, err)
    code, _, err = results["FULL"]
    assert code != 0 and "Traceback" in err and "trainer.precision='17-bits'" in err
    code, out, err = results["USER"]
    assert code == 0 and "_target_: trainer.demos.synthetic.MLPRegressor" in out, err
    assert not (early / "outputs").exists()
    assert not list(late.rglob("checkpoints")) and not list(late.rglob("tensorboard"))  # nothing trained


def test_bucket_cap_auto_reaches_the_strategy(hydra_context: None) -> None:
    cfg = compose_cfg(["strategy.bucket_cap_mb=auto"])
    validate(cfg)
    assert cli.construct("strategy", cfg.strategy).bucket_cap_mb == "auto"


def test_a_slurm_batch_job_names_its_directory_by_job_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our launcher inside an sbatch script (no srun): a requeued job runs the same command and finds its
    run directory (and preemption checkpoint); two commands of one job get two; salloc keeps the clock."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setattr(sys, "argv", ["ddp-train", "model.lr=0.1"])
    first = run_name("2024-01-01/10-00-00")
    assert first.startswith("slurm-4242-") and run_name("other clock") == first
    monkeypatch.setattr(sys, "argv", ["ddp-train", "model.lr=0.2"])
    assert run_name("x").startswith("slurm-4242-") and run_name("x") != first
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")
    assert run_name("2024-01-01/10-00-00") == "2024-01-01/10-00-00"


@pytest.mark.parametrize(("choice", "cls"), [("ddp", "DDPStrategy"), ("single", "SingleDeviceStrategy")])
def test_each_strategy_argument_is_written_once_in_code_and_once_in_the_yaml(hydra_context: None, choice: str,
                                                                               cls: str) -> None:
    """The constructor owns names, defaults and checks; conf/strategy/<choice>.yaml lists every argument
    the CLI may set (with its comment); the schema in between is derived, so the two cannot drift."""
    import inspect

    import strategies

    overrides = [f"strategy={choice}"] + (["trainer.devices=1"] if choice == "single" else [])
    cfg = compose_cfg(overrides)
    parameters = inspect.signature(getattr(strategies, cls).__init__).parameters
    assert set(cfg.strategy) - {"_target_"} == set(parameters) - {"self", "accelerator", "checkpoint_io"}
