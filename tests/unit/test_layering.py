"""The dependency arrow: trainer -> strategies -> torch; Lightning only where asked for."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
