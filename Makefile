# One-step install and the test command used by README and CI.
PYTHON ?= python3

.PHONY: install test test-all quickstart bench

install:
	bash scripts/install.sh

# Default suite: everything that runs on a CPU (gpu-marked tests skip themselves without CUDA).
# pytest's exit code 5 ("no tests collected") is a failure, like any other non-zero code.
test:
	$(PYTHON) -m pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; fi; exit $$rc

quickstart:
	lit-rl fit --config configs/quickstart.yaml
