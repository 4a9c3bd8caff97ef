"""What of Lightning's tests_pytorch is in scope, as code (README.md says the same in words).

Two layers:
1. PATHS: the test files/directories run at all (trainer-facing behaviour).
2. exclusion(item) -> reason | None: tests inside PATHS that are left out because they test
   Lightning's internals or need hardware / processes this machine does not have. The rule reads
   the test function's own source (decorators stripped; parametrize ids are checked separately),
   so it is the same for every mode and can be re-derived by anyone.
"""

from __future__ import annotations

import inspect
import re

# "core": the scope of the earlier (lost) harness, kept so figures stay comparable.
CORE = [
    "tests_pytorch/models/test_hooks.py",
    "tests_pytorch/trainer/flags",
    "tests_pytorch/trainer/optimization",
    "tests_pytorch/trainer/logging_",
    "tests_pytorch/callbacks/test_early_stopping.py",
    "tests_pytorch/callbacks/test_lr_monitor.py",
    "tests_pytorch/checkpointing",
    "tests_pytorch/loops",
]
# "wide": everything trainer-facing: all of trainer/, callbacks/, loggers/, plus the user-level model tests.
WIDE = [
    "tests_pytorch/models/test_hooks.py",
    "tests_pytorch/models/test_cpu.py",
    "tests_pytorch/models/test_restore.py",
    "tests_pytorch/models/test_hparams.py",
    "tests_pytorch/trainer",
    "tests_pytorch/callbacks",
    "tests_pytorch/loggers",
    "tests_pytorch/checkpointing",
    "tests_pytorch/loops",
]
SCOPES = {"core": CORE, "wide": WIDE}

# Whole files left out: (reason, path prefix).
FILE_RULES: list[tuple[str, str]] = [
    ("data: needs Lightning's legacy checkpoint archive (downloaded in their CI)", "tests_pytorch/checkpointing/test_legacy_checkpoints.py"),
    ("internal: accelerator/strategy selection internals", "tests_pytorch/trainer/connectors/test_accelerator_connector.py"),
    ("processes: SIGTERM across DDP processes", "tests_pytorch/trainer/test_ddp_sigterm_handling.py"),
]

# (reason, pattern) searched in the test function's body.
BODY_RULES: list[tuple[str, str]] = [
    # Lightning's private trainer members: connectors, result collections, loop objects.
    ("internal: private trainer member", r"\btrainer\._[a-z]"),
    ("internal: private connector", r"_(logger|checkpoint|accelerator|data|callback|signal)_connector\b|\bconnectors\b"),
    ("internal: loop objects", r"\.(fit|validate|test|predict)_loop\b|\bepoch_loop\b|\b_(Fit|TrainingEpoch|Evaluation|Prediction)Loop\b"
                               r"|\b_(Automatic|Manual)Optimization\b|\b_Loop\b|\boptim_progress\b|\bbatch_progress\b|\b_Progress\b"),
    ("internal: result collection", r"\b_Result(Collection|Metric)\b|\b_results\b"),
    ("internal: patches Lightning internals",
     r"(mock\.patch|patch)(\.object)?\(\s*[\"']lightning\.pytorch\.(trainer|loops|strategies|accelerators|core\.module)"
     r"|monkeypatch\.setattr\(\s*(lightning\.pytorch\.)?(trainer|loops)\b|patch\.object\(\s*(Trainer|_\w+Loop)\b"),
    ("internal: private strategy/precision objects", r"\bstrategy\._[a-z]|\bprecision_plugin\b|\b_PrecisionPlugin\b"),
    ("hardware: non-CPU accelerator", r"accelerator\s*=\s*[\"'](gpu|cuda|mps|tpu)|\bcuda_count_\d|\bmps_count_\d|\btpu_available\b"
                                      r"|\bxla_available\b|mock_cuda_count|\bmin_cuda_gpus\b|\.cuda\(\)"),
    ("processes: several devices/nodes", r"\bdevices\s*=\s*([2-9]|\[\s*\d\s*,)|\bnum_nodes\s*=\s*[2-9]|\bnum_processes\b"),
    ("processes: distributed strategy", r"strategy\s*=\s*[\"'](ddp|fsdp|deepspeed)|\bDDPStrategy\b|\bFSDPStrategy\b|\bDeepSpeed"
                                        r"|\bsingle_process_pg\b|\bstandalone\s*=\s*True"),
    ("out of scope: profiler", r"\bprofiler\b|\bProfiler\b"),
    ("out of scope: torch.compile", r"torch\.compile|\bdynamo\b"),
]
PARAM_RULE = ("hardware/processes: parameter value", r"^(gpu|cuda|mps|tpu|xla|ddp\w*|fsdp|deepspeed\w*)$")
MARK_KWARGS = {"min_cuda_gpus", "tpu", "mps", "standalone", "deepspeed", "bf16_cuda", "dynamo"}

_COMPILED = [(reason, re.compile(p)) for reason, p in BODY_RULES]
_PARAM = re.compile(PARAM_RULE[1], re.IGNORECASE)


def _body(func) -> str:
    try:
        lines = inspect.getsource(func).splitlines()
    except (OSError, TypeError):
        return ""
    for i, line in enumerate(lines):
        if re.match(r"\s*(async\s+)?def\s", line):
            return "\n".join(lines[i:])
    return "\n".join(lines)


def exclusion(item) -> str | None:
    for reason, prefix in FILE_RULES:
        if item.nodeid.startswith(prefix):
            return reason
    for mark in item.iter_markers("skipif"):
        if MARK_KWARGS & {k for k, v in mark.kwargs.items() if v}:
            return "hardware/processes: RunIf(" + ",".join(sorted(MARK_KWARGS & set(mark.kwargs))) + ")"
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        for value in callspec.params.values():
            if isinstance(value, str) and _PARAM.match(value):
                return PARAM_RULE[0]
            if isinstance(value, dict) and any(isinstance(v, str) and _PARAM.match(v) for v in value.values()):
                return PARAM_RULE[0]
            if isinstance(value, dict) and isinstance(value.get("devices"), int) and value["devices"] > 1:
                return PARAM_RULE[0]
    body = _body(getattr(item, "function", None))
    for reason, pattern in _COMPILED:
        if pattern.search(body):
            return reason
    return None
