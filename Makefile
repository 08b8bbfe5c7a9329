# shopstream — the README's two commands are `make demo` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup demo test test-unit test-integration reliability bench lint clean infra-up infra-down

setup:
	@bash scripts/setup.sh

demo: setup
	$(BIN)/shopstream demo

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: setup
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# The reliability suite at full size (CI's plain `pytest` runs the same tests, smaller).
reliability: setup
	SHOPSTREAM_RELIABILITY_FULL=1 $(BIN)/python -m pytest -m reliability -s $(PYTEST_ARGS)

bench: setup
	$(BIN)/python -m benchmarks.run_all

lint: setup
	$(BIN)/ruff check features training serving pipelines tests benchmarks

infra-up: setup
	$(BIN)/shopstream infra up

infra-down:
	$(BIN)/shopstream infra down

clean:
	-$(BIN)/shopstream infra down
	rm -rf .shopstream
