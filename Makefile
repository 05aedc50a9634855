# The two commands a newcomer needs: `make demo` and `make test`. Both set up a fresh machine.
PY := .venv/bin/python

.PHONY: setup demo test lint unit images
setup:
	bash hack/setup.sh

# Every image in deploy/images, on base images made from Debian's archive (setup builds them
# too; cached by content, so this is seconds unless something changed).
images: setup
	$(PY) -m hack.images build
	$(PY) -m hack.images sizes

demo: setup
	$(PY) -m examples.demo

# mypy's cache lives with the other caches, so a fresh clone checks only what changed.
lint: setup
	@start=$$(date +%s); \
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && \
	MYPY_CACHE_DIR=$${HOME}/.cache/ocm-fl/mypy .venv/bin/mypy hub_controller agent_addon workloads ocmfl ocmfl_cli hack examples bench && MYPY_CACHE_DIR=$${HOME}/.cache/ocm-fl/mypy .venv/bin/mypy --exclude tests/apps/ tests; \
	rc=$$?; echo "phase lint: $$(($$(date +%s) - start)) s"; exit $$rc

unit: setup
	.venv/bin/pytest tests/unit

test: setup lint
	bash hack/run-tests.sh
