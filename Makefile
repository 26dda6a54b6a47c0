# One entry for set-up, the demo and the tests. Each target runs the idempotent set-up first,
# which installs whatever is missing (seconds when nothing is).
.PHONY: setup demo test check benchmarks
VENV ?= .venv

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/hvd-dynbatch demo

test:
	bash scripts/setup.sh --test
	$(VENV)/bin/python -m pytest

# The tests that start no process (no launcher, no hvd-dynbatch command): under a minute.
check: setup
	$(VENV)/bin/python -m pytest -m "not processes" --timeout 60

benchmarks: setup
	bash benchmarks/run_all.sh
