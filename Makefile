# The README's two commands. Each creates .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: train test bench typecheck clean

$(STAMP): pyproject.toml requirements/torch-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/torch-cpu.txt
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/ddp-train

test: $(STAMP)
	$(PY) -m mypy
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .mypy_cache
