# The README's two commands are `make run` and `make test`; CI's .ci/run calls `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup engine tools run worker test test-reference lint

# The project environment, rebuilt when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	# Compile the bootstrap's kernel into numba's cache: the first report does not wait for it.
	$(BIN)/python -c 'from apps.analysis import resample; resample.warm_kernel()'
	touch $@

setup: $(VENV)/.installed

# The CPU vLLM engine (own venv under .engine/) and the tiny local model it serves.
# Idempotent: a second run only checks its stamps (see docs/ENGINE.md).
engine: setup
	bash scripts/engine-setup.sh

# Debian's packages the tests use: Chromium for the browser tests (Playwright never
# downloads its own) and docker-compose to validate docker-compose.yml.
tools:
	@command -v chromium >/dev/null && command -v docker-compose >/dev/null || \
	  { apt-get update -q && apt-get install -y -q chromium docker-compose; }

# Command 1: the whole service on embedded defaults (SQLite, file broker, CPU engine).
run: setup engine
	$(BIN)/python manage.py serve

# A worker for one host, e.g. `TAILTUNE_HOST=gpu-a make worker` (docs/ENGINE.md).
worker: setup
	$(BIN)/python manage.py run_worker

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python manage.py makemigrations --check --dry-run

# Command 2: lint and the whole test suite (unit, end-to-end on the CPU engine, browser), in two
# lanes of one core each on a machine with two cores or more (tests/lanes.py), else one lane.
# LANES=0 forces one lane. Each test's time and outcome: artifacts/junit.xml (JUnit XML).
LANES ?= $(shell [ "$$(nproc)" -ge 2 ] && echo 2 || echo 0)
test: setup engine tools lint
	$(BIN)/pytest -n $(LANES) --dist load --maxschedchunk 2 -m "not reference" --junitxml=artifacts/junit.xml

# The scaled-down reference sweep (tests/orchestration/test_reference_sweep_engine.py): about
# 15 minutes of one lane, left out of `make test` until it fits the suite's time.
test-reference: setup engine
	$(BIN)/pytest -n 0 -m reference tests/orchestration/test_reference_sweep_engine.py
