# One-step install and the test command used by README and CI.
PYTHON ?= python3

.PHONY: install lint test test-slow quickstart bench

install:
	bash scripts/install.sh

# Default suite: every test not marked `slow` (under 20 min on 2 cores; gpu-marked tests skip themselves without
# CUDA). `make test-slow`: the `slow` ones (end-to-end learning runs, minutes each); CI (.ci/run) runs both.
# pytest's exit code 5 ("no tests collected") is a failure, like any other non-zero code.
PYTEST = $(PYTHON) -m pytest -q -p no:cacheprovider

# Style (pyproject.toml [tool.ruff], [tool.mypy]): lint rules, the formatter's layout, and the types of
# the public API. `make test` runs it first, so a style error fails before minutes of tests; the same
# three commands are tests/test_style.py, for a plain pytest run.
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy

test: lint
	$(PYTEST) -m "not slow"; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; fi; exit $$rc

test-slow:
	$(PYTEST) -m slow; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; fi; exit $$rc

quickstart:
	lit-rl fit --config configs/quickstart.yaml
