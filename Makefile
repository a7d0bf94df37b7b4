# gsched: `make demo` runs the embedded cluster; `make test` runs the whole suite.
# Both create .venv on first use (torch and torchvision come from pip; see README).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit integration bench soak clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gsched demo

# Two workers, a test file to a worker (-n 2 --dist loadfile): the suite took 1,233-1,275 s serially on
# the CI machine's shape (2 cores), over its 20 minutes; 795-815 s so (the integration tests mostly wait).
test: $(STAMP) lint
	$(BIN)/python -m pytest -n 2 --dist loadfile -q -p no:cacheprovider --durations=15 tests

lint: $(STAMP)
	$(BIN)/ruff check scheduler agents policies tests benchmarks
	$(BIN)/mypy scheduler policies agents
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# Not part of `make test`: random multi-user churn with faults on a real local cluster (benchmarks/soak.py).
MINUTES ?= 30
SEED ?= 0
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak --minutes $(MINUTES) --seed $(SEED)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
