# The two commands a newcomer needs: `make demo` and `make test`. Both set up a fresh machine.
PY := .venv/bin/python

.PHONY: setup demo test lint unit
setup:
	bash hack/setup.sh

demo: setup
	$(PY) -m examples.demo

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy hub_controller agent_addon workloads ocmfl ocmfl_cli hack examples bench

unit: setup
	.venv/bin/pytest tests/unit

test: setup lint
	bash hack/run-tests.sh
