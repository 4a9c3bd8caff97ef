"""Our Trainer in a real Jupyter kernel at devices=2 on CPU, driven cell by cell as a notebook is:
classes and datasets defined in cells, two Trainers in one kernel, a raising rank, a rank that exits,
an interrupt during fit, and the objects Lightning's `ddp_notebook` carries (it forks) that pickling
cannot. After each failure the kernel lives on, nothing is left behind, and the next fit trains.
Weights are checked against the same training in one process on the global batch, and (conformance)
against Lightning's `ddp_notebook` running the same cells.

One kernel serves the module: the tests run in order, each adding cells to the same notebook. `make test`
runs the two Trainers in one kernel (the kernel's start and first fit take most of its ~15 s); the
failures, the interrupt and the objects only a fork carries run with `-m conformance`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.notebook import cells
from tests.notebook.kernel import Kernel


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("notebook")


@pytest.fixture(scope="module")
def kernel(workdir: Path) -> Iterator[Kernel]:
    kernel = Kernel(workdir / "ours")
    try:
        for source in (cells.setup("ours"), cells.DATA, cells.MODEL, cells.FIT, cells.UNPICKLABLE):
            result = kernel.run(source)
            assert result.error is None, result.error_text
        yield kernel
    finally:
        kernel.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _folders(workdir: Path) -> None:
    (workdir / "ours").mkdir(exist_ok=True)
    (workdir / "lightning").mkdir(exist_ok=True)


def _fits_again(kernel: Kernel) -> None:
    """The kernel lives on and the next fit trains as one process on the global batch would."""
    assert kernel.alive()
    assert kernel.value("torch.manual_seed(0); model = Net(); fit(model); matches_one_process(model, 0)") is True


def _nothing_left(kernel: Kernel, timeout_s: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := kernel.descendants()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.timeout(240)
def test_two_trainers_fit_in_one_kernel(kernel: Kernel) -> None:
    first_off, second_off, first_s, second_s = kernel.value(cells.TWO_TRAINERS)
    print(f"fit of a new Trainer in a kernel: first {first_s} s, second {second_s} s")  # figures, not asserted
    assert max(first_off, second_off) <= 1e-5, (first_off, second_off)


def _fails_then_recovers(kernel: Kernel, source: str) -> str:
    """Run a fit that rank 1 breaks: the cell's error names rank 1, nothing is left behind, the kernel
    lives on and its next fit trains. Returns the error as the cell shows it."""
    result = kernel.run(source)
    assert result.error is not None and "rank: 1" in result.error_text, result
    assert _nothing_left(kernel) == []
    _fits_again(kernel)
    return result.error_text + "\n" + result.streams


@pytest.mark.conformance
@pytest.mark.timeout(180)
def test_a_raising_rank_names_itself_and_shows_the_cells_line(kernel: Kernel) -> None:
    text = _fails_then_recovers(kernel, "torch.manual_seed(0); fit(Net(fail_on_rank=1))")
    assert "ValueError: bad batch 1 on rank 1" in text
    # The cell's file, line and source line, as Lightning shows them; not cloudpickle's "<dynamic-code>".
    assert "/ipykernel_" in text and 'raise ValueError(f"bad batch {batch_idx} on rank {self.global_rank}")' in text
    assert "<dynamic-code>" not in text


@pytest.mark.conformance
@pytest.mark.timeout(180)
def test_an_exiting_rank_says_where_its_stderr_went(kernel: Kernel) -> None:
    text = _fails_then_recovers(kernel, "torch.manual_seed(0); fit(Net(exit_on_rank=1))")
    assert "exited with code 3" in text and '__name__ == "__main__"' not in text
    assert "forwarded its stderr to this cell's output" in text
    assert "rank 1 leaves with os._exit(3)" in text  # in the cell's output indeed


@pytest.mark.conformance
@pytest.mark.timeout(180)
def test_an_interrupt_during_fit_ends_it_and_leaves_nothing(kernel: Kernel, workdir: Path) -> None:
    steps = workdir / "ours" / "steps"

    def training() -> bool:
        try:
            return int(steps.read_text()) >= 3
        except (OSError, ValueError):
            return False

    result = kernel.run_and_interrupt(f"fit(Net(marker={str(steps)!r}), max_epochs=1000)", when=training)
    # Lightning's graceful shutdown after Ctrl-C ends with exit(1); IPython shows it and the kernel lives on.
    assert result.error is not None and result.error["ename"] == "SystemExit", result.error_text
    assert result.error["evalue"] == "1"
    assert _nothing_left(kernel) == []
    _fits_again(kernel)


@pytest.mark.conformance
@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", list(cells.UNPICKLABLE_FITS))
def test_what_ddp_notebook_carries_trains(kernel: Kernel, case: str) -> None:
    """Each trains under Lightning's ddp_notebook (the conformance test below runs them there)."""
    result = kernel.run(cells.unpicklable_fit(case))
    assert result.error is None, result.error_text
    assert result.results[-1] == "True"


@pytest.mark.conformance
@pytest.mark.timeout(300)
def test_weights_match_lightnings_ddp_notebook(kernel: Kernel, workdir: Path) -> None:
    """The same cells in a kernel of Lightning's own, strategy="ddp_notebook": the weights after each fit
    match ours (runs the fits in our kernel too when the tests above were not selected)."""
    ours, theirs = workdir / "ours", workdir / "lightning"
    if not (ours / "second.pt").exists():
        kernel.value(cells.TWO_TRAINERS)
    lightning = Kernel(theirs)
    try:
        for source in (cells.setup("lightning.pytorch"), cells.DATA, cells.MODEL, cells.FIT, cells.UNPICKLABLE):
            result = lightning.run(source)
            assert result.error is None, result.error_text
        first, second = lightning.value(cells.TWO_TRAINERS)[:2]
        assert first and second  # Lightning's own agree with one process too
        for case in cells.UNPICKLABLE_FITS:
            assert lightning.value(cells.unpicklable_fit(case)) is True, case
    finally:
        lightning.shutdown()
    for name in ["first", "second", *cells.UNPICKLABLE_FITS]:
        if not (ours / f"{name}.pt").exists():
            continue  # ours could not fit it: its own test fails and says why
        mine, lightnings = torch.load(ours / f"{name}.pt"), torch.load(theirs / f"{name}.pt")
        for key, value in lightnings.items():
            assert torch.allclose(mine[key], value, atol=1e-5, rtol=1e-5), (name, key)
