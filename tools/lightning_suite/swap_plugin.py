"""pytest plugin (load with `-p swap_plugin`): swaps our Trainer (and, in `full` mode, our
callbacks/loggers) into Lightning's namespaces before any Lightning test module is imported,
applies the scope rule (scope.py), and writes one JSON record per test.

Environment:
  LIGHTNING_SUITE_MODE     baseline | trainer | full   (default baseline: nothing swapped)
  LIGHTNING_SUITE_RESULTS  path of the JSON file written at the end of the session
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import scope

MODE = os.environ.get("LIGHTNING_SUITE_MODE", "baseline")
if MODE not in ("baseline", "trainer", "full"):
    raise SystemExit(f"LIGHTNING_SUITE_MODE must be baseline, trainer or full, not {MODE!r}")
RESULTS = os.environ.get("LIGHTNING_SUITE_RESULTS")
# =1: run every collected test, the scope rule's exclusions too (to look at one excluded test by name;
# such a run's figures are not the yardstick's).
IGNORE_SCOPE = os.environ.get("LIGHTNING_SUITE_IGNORE_SCOPE", "") not in ("", "0")

# Lightning's packages whose public names the tests import (pytorch_lightning is optional).
_ROOTS = ["lightning.pytorch", "pytorch_lightning"]

# id(Lightning's object) -> (Lightning's object, ours). The object is kept: once no Lightning module holds it, it
# could be collected and its id reused by an unrelated class (a run once swapped `RandomDictDataset` for our Trainer).
_replaced: dict[int, tuple[object, object]] = {}
_swapped: list[str] = []            # "module.attr" names patched, for the record


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _swap(module_name: str, attr: str, new: object) -> None:
    module = _module(module_name)
    if module is None or not hasattr(module, attr):
        return
    old = getattr(module, attr)
    if old is new:
        return
    _replaced[id(old)] = (old, new)
    setattr(module, attr, new)
    _swapped.append(f"{module_name}.{attr}")


def _install() -> None:
    if MODE == "baseline":
        return
    from trainer import Trainer as OurTrainer

    for root in _ROOTS:
        for mod in ("", ".trainer", ".trainer.trainer"):
            _swap(root + mod, "Trainer", OurTrainer)
    if MODE != "full":
        return
    import trainer.callbacks as our_callbacks
    import trainer.loggers as our_loggers

    for ours, package in ((our_callbacks, "callbacks"), (our_loggers, "loggers")):
        for root in _ROOTS:
            theirs = _module(f"{root}.{package}")
            if theirs is None:
                continue
            for name in sorted(set(ours.__all__) & set(getattr(theirs, "__all__", ()))):
                new = getattr(ours, name)
                old = getattr(theirs, name)
                defining = getattr(old, "__module__", None)
                _swap(f"{root}.{package}", name, new)
                if defining and defining != theirs.__name__:
                    _swap(defining, name, new)   # `from lightning.pytorch.callbacks.model_checkpoint import ...`
                if getattr(_module(root), name, None) is old:
                    _swap(root, name, new)       # `from lightning.pytorch import Callback`


_install()


def _rewrite_test_globals() -> None:
    """Safety net: any Lightning object a test/helper module bound under another path is replaced too."""
    if not _replaced:
        return
    for name, module in list(sys.modules.items()):
        if not name.startswith("tests_pytorch") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            old, new = _replaced.get(id(value), (None, None))
            if old is value:
                setattr(module, attr, new)


_records: dict[str, dict] = {}


def pytest_collection_modifyitems(session, config, items):
    kept, dropped = [], []
    for item in items:
        reason = None if IGNORE_SCOPE else scope.exclusion(item)
        if reason is None:
            kept.append(item)
        else:
            dropped.append(item)
            _records[item.nodeid] = {"outcome": "excluded", "reason": reason}
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    _rewrite_test_globals()


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    if isinstance(report.longrepr, tuple):       # skip: (path, line, message)
        text = str(report.longrepr[2])
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def pytest_runtest_logreport(report):
    rec = _records.setdefault(report.nodeid, {"outcome": None, "duration": 0.0})
    rec["duration"] = round(rec.get("duration", 0.0) + report.duration, 3)
    if rec["outcome"] == "failed":
        return
    if report.failed:
        rec.update(outcome="failed", phase=report.when, message=_first_line(report))
    elif report.skipped and report.when in ("setup", "call"):
        rec.update(outcome="xfailed" if hasattr(report, "wasxfail") else "skipped", message=_first_line(report))
    elif report.when == "call" and report.passed:
        rec["outcome"] = "passed"


def pytest_sessionfinish(session, exitstatus):
    if not RESULTS:
        return
    ours = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[2]), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    import lightning

    data = {"mode": MODE, "lightning": lightning.__version__, "ours_commit": ours, "swapped": _swapped,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "tests": _records}
    Path(RESULTS).parent.mkdir(parents=True, exist_ok=True)
    Path(RESULTS).write_text(json.dumps(data, indent=1, sort_keys=True))
