# Two commands set everything up on a fresh machine: `make check` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip

.PHONY: check test test-all lint docs bench bench-decode bench-suite clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is pinned through constraints.txt in every install step, so no dependency can pull a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install --quiet -c constraints.txt torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	# Compiled once here: an editable install is otherwise compiled by every interpreter that
	# imports it where bytecode is not written (PYTHONDONTWRITEBYTECODE, read-only checkouts).
	$(BIN)/python -m compileall -q -x 'syntax_error' conformance tests benchmarks > /dev/null
	touch $(STAMP)

check: $(STAMP)
	$(BIN)/attention-conformance check --jobs 0

# What a contributor runs on every change (at most 6 minutes on two cores, from a fresh clone):
# ruff, the layers contract, the documentation (strict: a broken link or a page missing from it
# fails), and the tests but the slow tier: unit, integration, and the whole-catalogue proofs on
# the sample that keeps every form (tests/sample.py). Two pytest-xdist workers, a test file each
# at a time (a file's module fixtures run once).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo
	$(BIN)/mkdocs build --strict --quiet --site-dir $$(mktemp -d)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow"

# Everything: the whole-catalogue proofs on every bundled implementation and collection too.
# What CI runs (.ci/run).
test-all: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo
	$(BIN)/mkdocs build --strict --quiet --site-dir $$(mktemp -d)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# The documentation site, in site/.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# ruff, and the layers contract (pyproject.toml [tool.importlinter]; docs/architecture.md).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo

# The speed of the implementations themselves, beside SDPA.
bench: $(STAMP)
	$(BIN)/attention-conformance bench --json docs/bench-cpu.json --plot docs/bench-cpu.png

# The decode step with a KV cache, per token, beside SDPA over a concatenated cache.
bench-decode: $(STAMP)
	$(BIN)/attention-conformance bench --decode --rounds 15 --json docs/bench-decode-cpu.json

# The speed of the suite: where checking one implementation spends its time, phase by phase.
bench-suite: $(STAMP)
	$(BIN)/python benchmarks/phase_timing.py --json docs/phase-timing.json

clean:
	rm -rf $(VENV) build site *.egg-info
