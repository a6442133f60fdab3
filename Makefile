# Two commands matter on a fresh machine: `make demo` and `make test`. Both set up first.
.PHONY: setup demo test test-fast check lint bench reliability clean

VENV := .venv/bin

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	$(VENV)/pytest -W error -q

test-fast: setup
	$(VENV)/pytest -W error -q -m "not slow"

lint: setup
	$(VENV)/ruff format --check flakebot tests benchmarks
	$(VENV)/ruff check flakebot tests benchmarks
	$(VENV)/mypy flakebot

check: lint test

bench: setup
	$(VENV)/flakebot bench

reliability: setup
	$(VENV)/python -m benchmarks.reliability

clean:
	rm -rf scratch/runs
