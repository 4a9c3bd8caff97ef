"""The imports between trainer/'s modules, read with `ast` and classified by where they stand: at module level
(they run when the module loads), under `if TYPE_CHECKING:` (only mypy follows them) or inside a function (they
run on the first call). The layering tests (tests/unit/test_layering.py) assert on these measures;
`python -m tests.helpers.import_graph` prints them."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE, TYPE_ONLY, FUNCTION = "module", "type-only", "function"


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name, e.g. "trainer.loops.fit_loop"
    target: str  # the trainer module it names
    kind: str  # MODULE, TYPE_ONLY or FUNCTION
    optional: bool = False  # inside a function on purpose: its line's comment says "optional dependency"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(package: str = "trainer", root: Path = ROOT) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, importer: str, modules: dict[str, Path]) -> list[str]:
    """The package modules an import statement loads. `from trainer import checkpointing` names the submodule;
    a package the importer lives in is initialised before the importer anyway, so it is no edge."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = importer.split(".") if modules[importer].name == "__init__.py" else importer.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
    return [name for name in names if name in modules and not importer.startswith(name + ".")]


def imports(modules: dict[str, Path]) -> Iterator[Import]:
    """Every import from one package module of another, classified."""
    for importer, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        for statement, kind in _visit(ast.parse(source, filename=str(path)), MODULE):
            optional = kind == FUNCTION and "optional dependency" in lines[statement.lineno - 1]
            for target in _targets(statement, importer, modules):
                yield Import(importer, target, kind, optional)


def _visit(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Each import statement under `node`, with where it stands."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                yield from _visit(ast.Module(body=[statement], type_ignores=[]), TYPE_ONLY)
            for statement in child.orelse:
                yield from _visit(ast.Module(body=[statement], type_ignores=[]), kind)
        elif isinstance(child, ast.Import | ast.ImportFrom):
            yield child, kind
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _visit(child, FUNCTION)
        else:
            yield from _visit(child, kind)


def cycles(edges: list[Import], kinds: set[str]) -> list[list[str]]:
    """The strongly connected components (more than one module) of the graph of `kinds` imports (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set())
        graph.setdefault(edge.target, set())
        if edge.kind in kinds:
            graph[edge.importer].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def trainer_parameters(modules: dict[str, Path], package: str) -> list[str]:
    """`file:line function` for every parameter named `trainer` of a function in `package`."""
    found = []
    for name, path in modules.items():
        if name != package and not name.startswith(package + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                found += [f"{name}:{node.lineno}" for argument in arguments if argument.arg == "trainer"]
    return found


def _attribute_chain(node: ast.expr) -> list[str]:
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        chain.append(node.id)
    return chain[::-1]


# Calls that hand the Trainer on by design: to user hooks (the callback list) and to the stage's work (launch).
_HANDS_ON = (("callback_list",), ("strategy", "launch"))


def parts_handed_the_trainer(modules: dict[str, Path]) -> list[str]:
    """`module:line call` for every call of a method of one of the Trainer's parts (`trainer.data.request(...)`,
    in trainer.py `self.data...`) that passes the Trainer itself back as an argument."""
    found = []
    for name, path in modules.items():
        me = "self" if name == "trainer.trainer" else "trainer"
        source = path.read_text()
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            arguments = list(node.args) + [keyword.value for keyword in node.keywords]
            if not any(isinstance(argument, ast.Name) and argument.id == me for argument in arguments):
                continue
            chain = _attribute_chain(node.func)
            if len(chain) >= 3 and chain[0] == me and not any(tuple(chain[1:1 + len(on)]) == on for on in _HANDS_ON):
                found.append(f"{name}:{node.lineno} {'.'.join(chain)}")
    return sorted(found)


def measures(root: Path = ROOT) -> dict[str, object]:
    modules = package_modules("trainer", root)
    edges = list(imports(modules))

    def importers(target: str, kinds: set[str]) -> list[str]:
        return sorted({e.importer for e in edges if e.kind in kinds and (e.target == target
                                                                          or e.target.startswith(target + "."))})

    loops_users = [m for m in importers("trainer.loops", {MODULE, FUNCTION}) if not m.startswith("trainer.loops")]
    circle = cycles(edges, {MODULE, TYPE_ONLY, FUNCTION})
    return {
        "importing trainer.trainer at run time": importers("trainer.trainer", {MODULE, FUNCTION}),
        "importing trainer.trainer for types": importers("trainer.trainer", {TYPE_ONLY}),
        "function-level imports between trainer modules": sorted(
            {f"{e.importer} -> {e.target}" for e in edges if e.kind == FUNCTION and not e.optional}),
        "runtime import cycles (module level)": cycles(edges, {MODULE}),
        "runtime import cycles (module and function level)": cycles(edges, {MODULE, FUNCTION}),
        "modules outside loops/ importing it": loops_users,
        "largest import circle (all kinds)": max((len(c) for c in circle), default=0),
        "parameters named trainer in loops/": len(trainer_parameters(modules, "trainer.loops")),
        "calls handing a part the Trainer": parts_handed_the_trainer(modules),
    }


if __name__ == "__main__":
    for key, value in measures().items():
        count = len(value) if isinstance(value, list) else value
        print(f"{key}: {count}")
        if isinstance(value, list):
            for item in value:
                print(f"    {item}")
