#!/usr/bin/env python
"""Write classification.json: every test that passes under `baseline` but not under `trainer`/`full`,
sorted into
  a  exception type or message wording only (Lightning's MisconfigurationException / its text;
     the same exception type with other words; a warning emitted in other words),
  b  behaviour gap (what a user would see differ), one `gap` line + `repro`,
  i  the test (or a helper it calls) reaches Lightning's private objects and the scope rule, which
     reads only the test function's body, did not catch it; not a statement about behaviour.
The rules below were written after reading the failures; the first that matches wins. Anything no
rule matches is written as kind "?" so a new failure is never silently sorted.

usage: python tools/lightning_suite/classify.py RESULTS_DIR TESTS_DIR [--out classification.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

# Exception types our Trainer raises for bad input (the `a` rule applies when the test expects a raise).
OUR_RAISES = r"^(ValueError|TypeError|KeyError|RuntimeError|NotImplementedError|strategies\.\S+(Error|Preempted)|trainer\.\S+Error)\b"

# (kind, gap, repro, regex on "test_id | first line").  Order matters.
RULES: list[tuple[str, str, str, str]] = [
    # --- i: private objects reached from helpers / module-level code --------------------------------
    ("i", "test/helper calls Lightning's private connectors or result collection", "",
     r"'_(checkpoint|signal|accelerator)_connector'|'_results'"),
    ("i", "test calls Lightning Strategy internals (strategy.connect/launcher/world_size setter)", "",
     r"has no attribute '(connect|launcher)'|'world_size' of .* no setter"),
    ("i", "test patches Lightning's epoch loop (_get_monitor_value) from a helper", "", r"_get_monitor_value"),
    ("i", "test drives Lightning internals (optimizer setup / data connector) that read trainer.profiler", "",
     r"has no attribute 'profiler'"),
    ("i", "test calls Lightning's internal has_len_all_ranks with our strategy (strategy.reduce(reduce_op=...))", "",
     r"unexpected keyword argument 'reduce_op'"),
    ("i", "full mode: test reads/patches a private member of Lightning's callback class (ours has other internals)", "",
     r"'_log_info'|'_evaluate_stopping_criteria'|'_save_topk_checkpoint'|'_generate_state_key'"),
    ("i", "test reads trainer.predict_loop internals (setup_data, epoch_batch_indices)", "",
     r"test_trainer\.py::test_(index_batch_sampler_wrapper|trainer_predict_cpu).*predict_loop"),
    # --- a: wording / exception type ------------------------------------------------------------------
    ("a", "same exception type, other message", "", r"\| AssertionError: Regex pattern did not match\.$"),
    ("a", "warning emitted, other wording", "", r"Regex pattern did not match any of the \d+ warnings"),
    # --- b: behaviour gaps ------------------------------------------------------------------------------
    ("b", "trainer.state has no `.finished` (Lightning's TrainerState property); trainer.state is our TrainerStatus",
     "`trainer.fit(m); trainer.state.finished` -> AttributeError", r"'TrainerStatus' object has no attribute 'finished'|test_initialize_state"),
    ("b", "Lightning's ThroughputMonitor needs a Lightning precision plugin (trainer.precision_plugin)",
     "`Trainer(callbacks=[ThroughputMonitor(batch_size_fn=len)]).fit(m)` -> RuntimeError 'Expected a precision plugin'",
     r"Expected a precision plugin"),
    ("b", "`weights_only=False` refused when loading a checkpoint (fit/validate/test `weights_only=` argument)",
     "`trainer.fit(m, ckpt_path=p, weights_only=False)` -> ValueError (deliberate: no pickled code is run)",
     r"weights_only=False is not supported"),
    ("b", "Lightning's WeightAveraging/EMA callbacks read trainer.fit_loop.restarting, not in our loop view",
     "`Trainer(callbacks=[EMAWeightAveraging()]).fit(m)` -> AttributeError 'FitLoopView' ... 'restarting'",
     r"'FitLoopView' object has no attribute 'restarting'"),
    ("b", "plugins=[SLURMEnvironment(auto_requeue=..., requeue_signal=...)] refused (SLURM auto-requeue configured through Lightning's plugin)",
     "`Trainer(plugins=[SLURMEnvironment(requeue_signal=signal.SIGUSR1)])` -> ValueError",
     r"Trainer\(plugins=.*SLURMEnvironment"),
    ("b", "datamodule.save_hyperparameters() not written to the checkpoint (`datamodule_hyper_parameters` missing)",
     "`dm.save_hyperparameters(); trainer.fit(m, dm)`; the .ckpt lacks 'datamodule_hyper_parameters'",
     r"'datamodule_hyper_parameters' in"),
    ("b", "hparams passed as one dict/Namespace/OmegaConf argument are not restored by load_from_checkpoint",
     "`M(hparams={'a':1})` with save_hyperparameters(); `M.load_from_checkpoint(p)` -> TypeError missing 'hparams'",
     r"test_hparams\.py::test_(dict|namespace|omega_conf)_hparams\[SaveHparams(Decorated)?Model\]"),
    ("b", "save_hyperparameters details in checkpoints (init args collected from subclasses, runtime changes, hydra interpolation, pickle warning, key collisions, datamodule hparams logged)",
     "`trainer.fit(m)` then inspect ckpt['hyper_parameters'] / logger.log_hyperparams calls",
     r"models/test_hparams\.py::test_(collect_init_arguments|init_arg_with_runtime_change|model_save_hyper_parameters_interpolation_with_hydra|hparams_pickle_warning|colliding_hparams|adding_datamodule_hparams)"
     r"|loggers/test_logger\.py::test_log_hyperparams_key_collision"),
    ("b", "Lightning's BasePredictionWriter reads trainer.predict_loop (batch indices), which our Trainer lacks",
     "`Trainer(callbacks=[MyPredictionWriter(write_interval='batch')]).predict(m)` -> AttributeError 'predict_loop'",
     r"test_prediction_writer\.py.*predict_loop"),
    ("b", "no INFO log line '`Trainer(limit_*_batches=1)` was configured so 1 batch will be used' (and for overfit_batches / val_check_interval)",
     "`Trainer(limit_val_batches=1)`: Lightning logs an info line, ours logs nothing",
     r"was configured' in ''"),
    ("b", "TQDMProgressBar (Lightning's in trainer mode, ours in full mode) under our Trainer: no val_progress_bar in fast_dev_run, trainer.val_check_batch missing, tqdm reset/print/metrics differ",
     "`Trainer(fast_dev_run=True, callbacks=[TQDMProgressBar()]).fit(m)` then read bar.val_progress_bar / bar totals",
     r"test_tqdm_progress_bar\.py"),
    ("b", "reload_dataloaders_every_n_epochs with check_val_every_n_epoch>1: train/val loaders reloaded in other epochs than Lightning",
     "`Trainer(reload_dataloaders_every_n_epochs=2, check_val_every_n_epoch=3, max_epochs=10)`: count train/val_dataloader() calls",
     r"test_dataloaders_load_every_n_epochs_infrequent_val"),
    ("b", "KeyboardInterrupt during fit: Lightning runs on_exception then exits with SystemExit; ours re-raises KeyboardInterrupt",
     "a callback raising KeyboardInterrupt in on_train_batch_start: Lightning -> SystemExit, ours -> KeyboardInterrupt",
     r"DID NOT RAISE SystemExit"),
    ("b", "datamodule.on_exception() is not called when fit fails",
     "`class DM(LightningDataModule): def on_exception(self, e): ...`; a failing training_step: not called",
     r"test_trainer_calls_datamodule_on_exception"),
    ("b", "Lightning's Tuner (lr_find / scale_batch_size) cannot drive our Trainer",
     "`Tuner(trainer).lr_find(m)` -> AttributeError (callbacks setter / _accelerator_connector)",
     r"test_logger_reset_correctly"),
    ("b", "ckpt_path=None after fit in validate/test/predict: Lightning warns that it uses the best/last checkpoint; ours is silent",
     "`trainer.fit(m); trainer.test()` with a ModelCheckpoint: no UserWarning naming the checkpoint used",
     r"test_checkpoint_path_input(_last)?\[.*None\].*DID NOT WARN|test_checkpoint_path_input_last\[validate-False-last\]"),
    ("b", "remote / fsspec checkpoint paths (http://, memory://) are not read or leave files behind",
     "`trainer.fit(m, ckpt_path='http://host/epoch=0.ckpt')` -> CheckpointError 'does not exist'",
     r"http://127\.0\.0\.1|'memory:'|'memory:/"),
    ("b", "Lightning's BaseFinetuning: restoring its optimizer param-group metadata on resume fails",
     "fit with BackboneFinetuning, resume from its checkpoint -> ValueError 'different number of parameter groups'",
     r"different number of parameter groups"),
    ("b", "dataloader worker processes are not shut down at the points Lightning shuts them down",
     "`DataLoader(num_workers=2, persistent_workers=...)`: count worker shutdowns per epoch",
     r"test_workers_are_shutdown"),
    ("b", "checkpoint['loops'] carries our extra 'ddp_trainer' state, so restart parity checks on the loops dict differ (deliberate extras)",
     "compare ckpt['loops'] of a resumed run with an uninterrupted one: extra 'ddp_trainer' keys",
     r"'ddp_trainer"),
    ("b", "evaluation epoch metrics are logged after on_validation_end instead of before; on_*_epoch_end logging count differs",
     "log in on_validation_epoch_end and read logger in on_validation_end: Lightning already logged it",
     r"test_log_epoch_metrics_before_on_evaluation_end|test_on_evaluation_epoch_end"),
    ("b", "manual optimization: optimizer.step(closure) / multiple optimizers with self.log: the closure's calls and the logged counts differ",
     "manual step `opt.step(closure=closure)` counting closure calls / logged metric counts",
     r"test_manual_optimization\.py::test_(step_with_optimizer_closure|multiple_optimizers_manual_log)"),
    ("b", "nested collections of training dataloaders ({'a_b': [dl, dl], ...}) are not kept nested in the batch",
     "`trainer.fit(m, {'a_b': [dl1, dl2], 'c_d_e': [dl3, dl4, dl5]})`: batch['a_b'] has other shape",
     r"test_fit_multiple_train_loaders"),
    ("b", "trainer.fast_dev_run keeps True (Lightning) vs our normalised int 1",
     "`Trainer(fast_dev_run=True).fast_dev_run` -> 1 (Lightning: True)", r"test_dataloaders_with_fast_dev_run\[(1|True)\]"),
    ("b", "a warning Lightning emits is not emitted by ours",
     "see the test: Lightning's UserWarning/PossibleUserWarning (few workers, small loader with log interval, SWA, predict with no return, max_epochs unset, resume mid-epoch, eval mode, fast_dev_run tuner, fit val loop config)",
     r"DID NOT WARN"),
    ("b", "a misconfiguration Lightning rejects is accepted by ours",
     "see the test: e.g. TQDMProgressBar refresh rate, manual optimization with gradient_clip_val, infinite loader with a fractional limit",
     r"DID NOT RAISE (MisconfigurationException|RuntimeError)"),
    ("b", "NotImplementedError from a dataloader's __len__ escapes (Lightning treats the loader as infinite)",
     "`DataLoader` whose dataset __len__ raises NotImplementedError with limit_*_batches -> NotImplementedError",
     r"test_(inf_dataloader_raise_error_with_partial_batch_limits|train_dataloader_not_implemented_error).*\| NotImplementedError$"),
    ("b", "ModelSummary / logger / callback defaults: trainer.callbacks list and loggers property differ from Lightning's (summary callback present, configure_callbacks, loggers setter)",
     "`Trainer(enable_model_summary=True).callbacks` / `trainer.loggers = [...]` compared with Lightning",
     r"test_model_summary\.py::|test_rich_integration\.py::.*test_no_rich_defaults|test_trainer_loggers_(property|setters)|test_configure_external_callbacks|test_configure_model_checkpoint"),
    ("b", "Trainer arguments/attributes Lightning has: trainer.init_module(), default_root_dir '~' expansion",
     "`with trainer.init_module(): ...` -> AttributeError; `Trainer(default_root_dir='~/x').default_root_dir` not expanded",
     r"'init_module'|test_expand_home_trainer"),
    ("b", "configure_callbacks() returning Mock objects is refused (our type check) / callbacks reconfigured per stage",
     "`configure_callbacks()` returning a non-Callback object -> TypeError", r"callbacks must be Callback instances"),
    ("b", "self.log from callback hooks with on_step=False, on_epoch=False (or in configure_callbacks) raises LoggingError in ours",
     "`pl_module.log('x', 1, on_step=False, on_epoch=False)` in on_train_batch_start -> LoggingError",
     r"test_log_works_in_(val|train)_callback|test_fx_validator_integration"),
    ("b", "LightningModule.strict_loading is ignored when resuming (load_state_dict always strict)",
     "`model.strict_loading = False; trainer.fit(model, ckpt_path=p)` with missing keys -> error in ours",
     r"test_strict_loading"),
    ("b", "a metric logged under the key 'step' is not used as the logger's step",
     "`self.log('step', n)`: Lightning passes step=n to logger.log_metrics, ours the global step",
     r"test_adding_step_key"),
    ("b", "logger.experiment is not created at the start of fit (lazy init order; under ddp_spawn rank 0 has no _experiment when callbacks look)",
     "a callback asserting `trainer.logger._experiment` in on_fit_start / WandbLogger experiment accessed first",
     r"test_logger_initialization|test_wandb_logger_experiment_called_first"),
    ("b", "Lightning's LightningCLI cannot build our Trainer (trainer arguments parsed as NestedArg)",
     "`LightningCLI(trainer_class=Trainer, args=['--trainer.logger=WandbLogger'])` -> AttributeError",
     r"NestedArg"),
    ("b", "max_time adds no Timer callback to trainer.callbacks",
     "`Trainer(max_time={'seconds': 10}).callbacks` has no Timer", r"test_timer\.py::test_trainer_flag"),
    ("b", "no INFO log when min_epochs/min_steps are not yet reached and should_stop is set",
     "`Trainer(min_epochs=2)` with trainer.should_stop=True in epoch 0: Lightning logs an info line once",
     r"test_trainer_min_steps_and_min_epochs_not_reached"),
    ("b", "full mode: our CSVLogger has no `.experiment` (Lightning's ExperimentWriter) and log_hyperparams() needs params",
     "`CSVLogger(save_dir).experiment.metrics_file_path` -> AttributeError; `logger.log_hyperparams()` -> TypeError",
     r"'CSVLogger' object has no attribute 'experiment'|CSVLogger\.log_hyperparams\(\) missing"),
    ("b", "full mode: our TensorBoardLogger: log_graph needs an attached model, sub_dir layout, hparams.yaml written more than once",
     "`TensorBoardLogger(save_dir, sub_dir='x').log_dir` / `logger.log_graph(model, input)` without a Trainer",
     r"test_tensorboard\.py::test_tensorboard_(log_graph|log_sub_dir|save_hparams_to_yaml_once)"),
    ("b", "full mode: our ModelCheckpoint: train_time_interval saves nothing; missing monitor key raises where Lightning waits; no score handed to WandbLogger",
     "`ModelCheckpoint(train_time_interval=timedelta(seconds=1))` over a run of several seconds: no files",
     r"test_model_checkpoint_train_time_interval|test_callbacks_references_fit_ckpt_path|test_wandb_log_model_with_score"),
    ("b", "full mode: two plain Callback() instances are treated as duplicate stateful callbacks",
     "`Trainer(callbacks=[Callback(), Callback()])` -> RuntimeError 'more than one stateful callback'",
     r"test_validate_callbacks_list_function"),
    ("b", "ModelSummary / logger / callback defaults: progress bar chosen when the user passes a TQDMProgressBar without rich",
     "`Trainer(callbacks=[TQDMProgressBar()])`: count progress bars in trainer.callbacks", r"test_no_rich_respects_user_provided_tqdm"),
    ("b", "trainer.accelerator is the accelerator's name (a str), not Lightning's Accelerator object (DeviceStatsMonitor calls get_device_stats on it)",
     "`Trainer(callbacks=[DeviceStatsMonitor()]).fit(m)` -> AttributeError 'str' object has no attribute 'get_device_stats'",
     r"has no attribute 'get_device_stats'"),
    ("b", "Lightning's StochasticWeightAveraging sets trainer.fit_loop._skip_backward for its batch-norm epoch; our loop view has no such switch",
     "`Trainer(callbacks=[StochasticWeightAveraging(swa_lrs=0.1)]).fit(m)` -> AttributeError 'FitLoopView' ... '_skip_backward'",
     r"_skip_backward"),
    ("b", "fast_dev_run's logger is our DummyLogger, not an instance of Lightning's DummyLogger",
     "`Trainer(fast_dev_run=True).logger` -> trainer.loggers.base.DummyLogger",
     r"test_callbacks_and_logger_not_called_with_fastdevrun"),
    ("b", "a datamodule's OmegaConf hyperparameters come back from load_from_checkpoint as a plain dict, not a DictConfig (the checkpoint lacks the datamodule's hparams type)",
     "`dm = DM(hparams=OmegaConf.create(...))`, fit, `type(DM.load_from_checkpoint(p).hparams)` -> AttributeDict",
     r"test_omega_conf_hparams\[SaveHparams(Decorated)?DataModule\]"),
    ("b", "miscellaneous behaviour (see message)", "", r".*"),
]


def function_source(tests_dir: Path, test_id: str) -> str:
    path, _, rest = test_id.partition("::")
    name = rest.split("::")[-1].split("[")[0]
    try:
        tree = ast.parse((tests_dir / path).read_text())
    except (OSError, SyntaxError):
        return ""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return ast.get_source_segment((tests_dir / path).read_text(), node) or ""
    return ""


def classify(test_id: str, message: str, source: str) -> dict:
    line = f"{test_id} | {message}"
    for kind, gap, repro, pattern in RULES[:7]:
        if re.search(pattern, line):
            return {"kind": kind, "gap": gap, **({"repro": repro} if repro else {})}
    # our own exception where the test expects one (a pytest.raises of another type or text) -> a
    if re.search(OUR_RAISES, message) and "pytest.raises(" in source and not re.search(
            r"weights_only=False|Expected a precision plugin"
            r"|SLURMEnvironment|different number of parameter groups|callbacks must be Callback|test_log_works_in|test_fx_validator", line):
        return {"kind": "a", "gap": "our exception type/message where Lightning's test expects its own (mostly MisconfigurationException)"}
    for kind, gap, repro, pattern in RULES[7:]:
        if re.search(pattern, line):
            entry = {"kind": kind, "gap": gap, **({"repro": repro} if repro else {})}
            if gap.startswith("miscellaneous"):
                entry["kind"] = "?"
            return entry
    return {"kind": "?", "gap": ""}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path)
    p.add_argument("tests_dir", type=Path, help="Lightning's `tests` directory (holding tests_pytorch/)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "classification.json")
    p.add_argument("--modes", nargs="+", default=["trainer", "full"])
    args = p.parse_args()
    base = json.loads((args.results / "baseline.json").read_text())["tests"]
    out: dict[str, dict] = {}
    for mode in args.modes:
        path = args.results / f"{mode}.json"
        if not path.exists():
            continue
        tests = json.loads(path.read_text())["tests"]
        for t, r in sorted(tests.items()):
            if base.get(t, {}).get("outcome") != "passed" or r["outcome"] == "passed" or t in out:
                continue
            msg = r.get("message", "")
            entry = classify(t, msg, function_source(args.tests_dir, t))
            entry["first_line"] = msg[:160]
            entry["seen_in"] = mode
            out[t] = entry
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    kinds: dict[str, int] = {}
    for e in out.values():
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    print(f"{len(out)} tests classified -> {args.out}: {kinds}")
    for t, e in out.items():
        if e["kind"] == "?":
            print("  ?", t, "|", e["first_line"][:140])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
