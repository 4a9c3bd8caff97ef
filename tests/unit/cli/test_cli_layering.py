"""The command line sits on top of the runtime, never inside it: nothing in `trainer/` outside the
`trainer/cli/` package (but `python -m trainer`'s `__main__.py`) and nothing in `strategies/` imports it,
so a rank, a LightningCLI program or a user's script never pays for Hydra."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CLI = ROOT / "trainer" / "cli"
ENTRY_POINT = ROOT / "trainer" / "__main__.py"


def _imports_the_cli(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("trainer.cli")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "trainer.cli" or node.module.startswith("trainer.cli."):
                found.append(node.module)
            elif node.module == "trainer" and any(alias.name == "cli" for alias in node.names):
                found.append("trainer.cli")
    return found


def test_the_runtime_never_imports_the_cli() -> None:
    runtime = [path for package in ("trainer", "strategies") for path in sorted((ROOT / package).rglob("*.py"))
               if CLI not in path.parents and path != ENTRY_POINT]
    offenders = [f"{path.relative_to(ROOT)} imports {name}" for path in runtime for name in _imports_the_cli(path)]
    assert runtime and offenders == []
