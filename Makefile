# The README's two commands. Each creates .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: train test conformance bench bench-check typecheck clean

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

# The slow runs make test skips: differential runs against Lightning, fault and kill scenarios, more parametrisations.
conformance: $(STAMP)
	$(PY) -m pytest -q -m conformance

bench: $(STAMP)
	$(PY) -m benchmarks.run

# Before committing a change to the reducer, buckets, comm hooks, shm transport or the training step:
# ours against torch DDP and ours-inside-Lightning, interleaved; fails beyond the run's own noise (#37).
bench-check: $(STAMP)
	$(PY) -m benchmarks.check

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .mypy_cache
