# Two commands matter on a fresh machine: `make demo` and `make test`. Both set up first.
.PHONY: setup bench-setup demo test test-fast check lint bench eval reliability clean

VENV := .venv/bin

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup lint
	$(VENV)/pytest -W error -q

test-fast: setup
	$(VENV)/pytest -W error -q -m "not slow"

lint: setup
	$(VENV)/ruff format --check -q flakebot templates tests benchmarks
	$(VENV)/ruff check -q flakebot templates tests benchmarks
	$(VENV)/mypy flakebot benchmarks

check: test

bench-setup:
	@bash scripts/bench-setup.sh

bench: bench-setup
	$(VENV)/python -m benchmarks

eval: setup
	$(VENV)/flakebot eval
	$(VENV)/python -m benchmarks.eval_readme

reliability: setup
	$(VENV)/python -m benchmarks.reliability

# Runs live in the work directory (~/.local/state/flakebot unless workdir is set); ./scratch/runs holds the
# runs of a flakebot that defaulted to it.
clean:
	if [ -x $(VENV)/flakebot ]; then $(VENV)/flakebot clean --all; fi
	rm -rf scratch/runs
