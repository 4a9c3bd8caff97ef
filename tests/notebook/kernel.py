"""A real Jupyter kernel (ipykernel), driven cell by cell through nbclient as a notebook front end
drives it: each cell is a cell of a notebook built with nbformat, its outputs (streams, errors) come
back as the front end would show them, and an interrupt goes to the kernel's process group as
Jupyter's own interrupt does."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient

from tests.helpers.processes import alive

REPO = Path(__file__).resolve().parents[2]


@dataclass
class CellResult:
    """What the front end shows for one cell."""

    source: str
    streams: str = ""  # stdout and stderr, as shown under the cell
    error: dict[str, Any] | None = None  # ename, evalue, traceback (a list of ANSI-coloured lines)
    results: list[str] = field(default_factory=list)  # text/plain of execute_result outputs

    @property
    def error_text(self) -> str:
        """The error as the cell shows it (the exception's message and IPython's traceback), plain."""
        if self.error is None:
            return ""
        import re

        lines = [self.error["evalue"], *self.error["traceback"]]
        return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(lines))


class Kernel:
    """One kernel for a test module: started in `workdir`, with the repository importable and the
    environment of a notebook server (not pytest's: ipykernel forwards fd-level output to the cell
    only outside pytest)."""

    def __init__(self, workdir: Path, cell_timeout_s: int = 150) -> None:
        self.notebook = nbformat.v4.new_notebook()
        self.client = NotebookClient(self.notebook, timeout=cell_timeout_s, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(workdir)}})
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.client.km = self.client.create_kernel_manager()
        self.client.start_new_kernel(env=env, cwd=str(workdir))
        self.client.start_new_kernel_client()

    @property
    def pid(self) -> int:
        return int(self.client.km.provisioner.pid)  # type: ignore[union-attr]

    def run(self, source: str) -> CellResult:
        """Append `source` as the notebook's next cell and execute it."""
        cell = nbformat.v4.new_code_cell(textwrap.dedent(source).strip())
        self.notebook.cells.append(cell)
        self.client.execute_cell(cell, len(self.notebook.cells) - 1)
        result = CellResult(cell.source)
        for output in cell.outputs:
            if output.output_type == "stream":
                result.streams += output.text
            elif output.output_type == "error":
                result.error = {"ename": output.ename, "evalue": output.evalue, "traceback": output.traceback}
            elif output.output_type == "execute_result":
                result.results.append(output.data.get("text/plain", ""))
        return result

    def value(self, expression: str) -> Any:
        """Evaluate `expression` in the kernel (a literal: numbers, strings, lists, dicts)."""
        import ast

        result = self.run(expression)
        assert result.error is None, result.error_text
        return ast.literal_eval(result.results[-1])

    def run_and_interrupt(self, source: str, when: Callable[[], bool], timeout_s: float = 120) -> CellResult:
        """Execute `source` and interrupt the kernel once `when()` holds, as Jupyter's interrupt
        button does (SIGINT to the kernel's process group)."""
        def interrupt() -> None:
            deadline = time.monotonic() + timeout_s
            while not when() and time.monotonic() < deadline:
                time.sleep(0.05)
            os.killpg(os.getpgid(self.pid), signal.SIGINT)

        watcher = threading.Thread(target=interrupt, daemon=True)
        watcher.start()
        try:
            return self.run(source)
        finally:
            watcher.join(timeout_s)

    def descendants(self) -> list[str]:
        """The kernel's live descendant processes ("pid: command"), multiprocessing's resource tracker aside."""
        children: dict[int, list[int]] = {}
        commands: dict[int, str] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
                commands[int(stat.parent.name)] = command
        found, todo = [], list(children.get(self.pid, []))
        while todo:
            pid = todo.pop()
            todo.extend(children.get(pid, []))
            if "resource_tracker" not in commands[pid]:
                found.append(f"{pid}: {commands[pid][:120]}")
        return found

    def alive(self) -> bool:
        return alive(self.pid)

    def shutdown(self) -> None:
        self.client._cleanup_kernel()
