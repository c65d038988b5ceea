# Two entry points for a new user (see README.md):
#   make run   set up .venv; embedded broker + live daemon + the bundled real
#              trace slice published into it, with a live summary (Ctrl-C stops)
#   make test  set up .venv and run the strict docs build, lint, types and the
#              whole test suite
#   make docs  the documentation site into site/ (mkdocs, --strict)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: run replay test docs lint typecheck unit bench browser test-tools clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,evaluation,broker]'
	touch $(STAMP)

# The slice spans 3.5 days of event time (its arrivals 16.7 h): at 5,000x real
# time the arrivals take 12 s and the whole slice a minute.
run: $(STAMP)
	$(BIN)/lavad demo data/azure-v1-vms-slice --config config/lavad.toml --speed 5000

# The bundled slice holds 16.7 h of arrivals, so its warm-up is 6 h rather than
# the default day (which suits the full traces).
replay: $(STAMP)
	$(BIN)/lavad replay data/azure-v1-vms-slice --warmup-s 21600 \
		--compare bestfit,firstfit --config config/lavad.toml --plot lavad-replay.png

test: $(STAMP) docs lint typecheck unit

# The docs extra (mkdocs, mkdocs-material, jsonschema) on top of the install above,
# with its own stamp, so the install line stays as it is.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

# The reference pages are generated from the code first (docs/gen_reference.py:
# configuration keys, commands, event and decision JSON Schemas), then the site
# is built strictly: a broken link or anchor, or a page left out of the nav, fails.
docs: $(DOCS_STAMP)
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint docker/Dockerfile
	@# No Docker engine (or compose plugin) on our machines: dclint checks the
	@# compose file against the Compose schema; it comes from the npm registry.
	@if command -v npx >/dev/null; then npx --yes dclint@3.1.0 docker/compose.yaml; \
	else echo "compose lint skipped: needs node/npx (npm registry)"; fi

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite runs on two workers (pytest-xdist; one on a one-core machine): much
# of its time is live tests waiting on their own embedded brokers, each on a
# free port of its own. On a two-core box one worker took about 1.5 times as
# long as two. Three took 8 min 49 s against 10 min 18 s for two on a warm
# tree in the same hour, but `.ci/run` on fresh clones took 11 min 13 s to
# 13 min 24 s on three against 11 min 44 s to 12 min 24 s on two: no gain
# where it counts, and more contention. Four ran each live test about twice
# as long as on two, nearer its timeouts. Two stay.
unit: $(STAMP) test-tools
	$(BIN)/pytest -n auto --maxprocesses 2

bench: $(STAMP)
	$(BIN)/python -m benchmarks
	$(BIN)/python -m benchmarks --live

# Headless Chromium (Debian's package) for the browser check of `lavad report`
# in tests/test_report_html.py, which skips without it. Needs root or sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@if [ -x /usr/bin/chromium ]; then echo "chromium: /usr/bin/chromium is installed"; \
	else $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends chromium; fi

# Debian's packages the tests use: stunnel4 and openssl for
# tests/test_live_security.py, which terminates TLS in front of the embedded
# broker, and prometheus for its promtool, which checks and unit-tests the
# alert rules (tests/test_dashboard.py). Installed as root or with
# password-less sudo; elsewhere those tests skip, saying why (.ci/run sets
# CI_REQUIRE_STUNNEL and CI_REQUIRE_PROMTOOL, which make them fail instead).
test-tools:
	@if command -v stunnel4 >/dev/null && command -v openssl >/dev/null \
		&& command -v promtool >/dev/null; then \
		echo "test-tools: stunnel4, openssl and promtool are installed"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -q && apt-get install -y -q --no-install-recommends stunnel4 openssl prometheus; \
	elif sudo -n true 2>/dev/null; then \
		sudo apt-get update -q && sudo apt-get install -y -q --no-install-recommends stunnel4 openssl prometheus; \
	else echo "test-tools: stunnel4/openssl/promtool missing and not installable here (needs" \
		"root or password-less sudo): the TLS and alert-rule tests will skip"; fi

clean:
	rm -rf $(VENV) build *.egg-info site docs/reference
