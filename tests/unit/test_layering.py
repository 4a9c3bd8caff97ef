"""The dependency arrow: trainer -> strategies -> torch; Lightning only where asked for."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.import_graph import measures

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_strategies_never_import_trainer() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "strategies").rglob("*.py"))
        for name in _imported_modules(path)
        if name == "trainer" or name.startswith("trainer.")
    ]
    assert offenders == []


def test_only_the_lightning_adapters_import_lightning() -> None:
    allowed = ROOT / "strategies" / "lightning"  # the strategy adapter package
    cli = ROOT / "trainer" / "lightning_cli.py"  # and Lightning's command line on our Trainer, nothing else
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for package in ("strategies", "trainer")
        for path in sorted((ROOT / package).rglob("*.py"))
        if allowed not in path.parents and path != cli
        for name in _imported_modules(path)
        if name.split(".")[0] in ("pytorch_lightning", "lightning", "lightning_fabric")
    ]
    assert offenders == []


def test_import_trainer_does_not_load_lightning_or_the_config_stack() -> None:
    """Every rank imports `trainer`: Lightning costs 0.6 s there, Hydra/OmegaConf 0.1 s and 7 MiB."""
    heavy = ("pytorch_lightning", "lightning", "lightning_fabric", "hydra", "omegaconf", "yaml")
    code = (f"import sys, trainer, strategies; "
            f"bad = sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})); "
            f"print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------- inside trainer/ (issue #41)
# The measures are read by tests/helpers/import_graph.py (`python -m tests.helpers.import_graph` prints them).
# Each assertion is the state reached so far: a change may lower a number, never raise it.

@functools.cache
def _measures() -> dict[str, Any]:
    return measures(ROOT)


def test_no_runtime_import_cycle_inside_trainer() -> None:
    """A cycle of imports that run (at module level, or inside a function on its first call) breaks depending
    on which module a program imports first, or hides a dependency from the reader."""
    assert _measures()["runtime import cycles (module level)"] == []
    assert _measures()["runtime import cycles (module and function level)"] == []


def test_no_function_level_imports_inside_trainer() -> None:
    """An import inside a function hides a dependency (and usually an import cycle) from the reader. One that
    keeps an optional dependency optional says so in a comment on its line ("# optional dependency: ...")."""
    assert _measures()["function-level imports between trainer modules"] == []


def test_only_the_facade_and_its_users_import_the_trainer_module() -> None:
    """The concrete Trainer is imported at run time only by the package and the command lines (trainer/cli/,
    trainer/lightning_cli.py): every other part is handed what it needs."""
    importers = _measures()["importing trainer.trainer at run time"]
    assert [name for name in importers if not name.startswith("trainer.cli.")] == ["trainer", "trainer.lightning_cli"]


def test_modules_importing_the_trainer_module_for_types() -> None:
    """Only the facade's launch helper; the rest take a Stage or a protocol of what they read (trainer/stage.py,
    trainer/schedule.py, trainer/lightning_views.py, run.py's StageRunner, the module's `trainer` typed as the
    contract)."""
    assert _measures()["importing trainer.trainer for types"] == ["trainer.launch"]


def test_loops_is_a_layer() -> None:
    """loops/ holds the drivers; what other parts need (the schedule, the non-finite watch, backward, the batch
    counts, the predict run's record) lives below it. Only the stage runner drives the loops."""
    assert _measures()["modules outside loops/ importing it"] == ["trainer.run"]


def test_the_import_circle_inside_trainer() -> None:
    """Modules tied into one circle by their imports (type-only ones included) change together."""
    assert _measures()["largest import circle (all kinds)"] <= 2  # the Trainer and its launch helper


def test_parameters_named_trainer_in_loops() -> None:
    """Every loop driver takes a Stage (trainer/stage.py); user hooks get its `trainer`."""
    assert _measures()["parameters named trainer in loops/"] == 0


def test_parts_handed_the_trainer() -> None:
    """A part that takes the whole Trainer back can read and change anything; it should get what it uses."""
    assert _measures()["calls handing a part the Trainer"] == []


def test_the_measures_see_what_they_count(tmp_path: Path) -> None:
    """The tool on a made-up package: each kind of import is classified, and each measure counts it."""
    files = {
        "__init__.py": "from trainer.trainer import Trainer\n",
        "trainer.py": "from trainer.loops import drive\n",
        "loops/__init__.py": "",
        "loops/drive.py": ("from typing import TYPE_CHECKING\n"
                           "if TYPE_CHECKING:\n"
                           "    from trainer.trainer import Trainer\n"
                           "def run(trainer):\n"
                           "    trainer.data.request(trainer)\n"
                           "    trainer.callback_list.call('h', trainer)\n"),
        "part.py": ("def late():\n    from trainer.loops import drive\n"
                    "def lazy():\n    from trainer import extra  # optional dependency: not counted\n"),
        "extra.py": "",
    }
    for name, text in files.items():
        (tmp_path / "trainer" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "trainer" / name).write_text(text)
    found = measures(tmp_path)
    assert found["importing trainer.trainer at run time"] == ["trainer"]
    assert found["importing trainer.trainer for types"] == ["trainer.loops.drive"]
    assert found["function-level imports between trainer modules"] == [  # the package's __init__ runs too
        "trainer.part -> trainer.loops", "trainer.part -> trainer.loops.drive"]
    assert found["modules outside loops/ importing it"] == ["trainer.part", "trainer.trainer"]
    assert found["largest import circle (all kinds)"] == 2  # trainer.trainer <-> trainer.loops.drive (type-only)
    assert found["parameters named trainer in loops/"] == 1
    assert found["calls handing a part the Trainer"] == ["trainer.loops.drive:5 trainer.data.request"]
