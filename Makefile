# Two entry points for a new user (see README.md):
#   make run   set up .venv and replay the bundled real trace slice
#   make test  set up .venv and run lint, types and the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The bundled slice holds 16.7 h of arrivals, so its warm-up is 6 h rather than
# the default day (which suits the full traces).
run: $(STAMP)
	LAVAD_METRICS__WARMUP_S=21600 $(BIN)/lavad replay data/azure-v1-vms-slice \
		--compare bestfit,firstfit --config config/lavad.toml --plot lavad-replay.png

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
