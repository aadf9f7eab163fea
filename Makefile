# One-step install and the test command used by README and CI.
PYTHON ?= python3

.PHONY: install lint test test-slow quickstart bench docs

install:
	bash scripts/install.sh

# Default suite: every test not marked `slow` (under 20 min on 2 cores; gpu-marked tests skip themselves without
# CUDA). `make test-slow`: the `slow` ones (end-to-end learning runs, minutes each); CI (.ci/run) runs both.
# pytest's exit code 5 ("no tests collected") is a failure, like any other non-zero code.
PYTEST = $(PYTHON) -m pytest -q -p no:cacheprovider

# Style (pyproject.toml [tool.ruff], [tool.mypy]): lint rules, the formatter's layout, and the types of
# the whole package. `make test` runs it first, so a style error fails before minutes of tests; the same
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

# The docs site (mkdocs.yml): README as its front page, the guides, the experiment logs, the architecture, the
# settings reference and the API reference, built strictly (a warning or a broken link fails) into $(SITE).
# Open $(SITE)/index.html in a browser, or run `python -m mkdocs serve` for a live preview.
SITE ?= site
docs:
	$(PYTHON) -m mkdocs build --strict --site-dir $(SITE)
	@echo "docs: open $(abspath $(SITE))/index.html"
