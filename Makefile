# shopstream — the README's two commands are `make demo` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
DEMO_ARGS ?=
BENCH_ARGS ?=

.PHONY: setup demo test test-unit test-integration reliability bench bench-smoke lint clean infra-up infra-down

setup:
	@bash scripts/setup.sh

# e.g. make demo DEMO_ARGS="--all-models --keep-running"
demo: setup
	$(BIN)/shopstream demo $(DEMO_ARGS)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: setup
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# The reliability suite at full size (CI's plain `pytest` runs the same tests, smaller).
reliability: setup
	SHOPSTREAM_RELIABILITY_FULL=1 $(BIN)/python -m pytest -m reliability -s $(PYTEST_ARGS)

# all three benchmarks at their default sizes, then the README table; e.g. BENCH_ARGS=training
bench: setup
	$(BIN)/python -m benchmarks.run_all $(BENCH_ARGS)

# every benchmark at a tiny size (CI): results under benchmarks/results/smoke, README untouched
bench-smoke: setup
	$(BIN)/python -m benchmarks.run_all --smoke --results-dir benchmarks/results/smoke --no-readme

lint: setup
	$(BIN)/ruff check features training serving pipelines tests benchmarks

infra-up: setup
	$(BIN)/shopstream infra up

infra-down:
	$(BIN)/shopstream infra down

clean:
	-$(BIN)/shopstream infra down
	rm -rf .shopstream
