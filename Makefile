# toolrelay developer entry points. The two that matter: `make run` (the demo on
# http://127.0.0.1:8000) and `make test` (the whole suite; Postgres when DATABASE_URL is set).

SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Reinstalled only when pyproject.toml (or the venv itself) is newer than this stamp.
STAMP := var/install.stamp
SECRETS := var/secrets.env

# The lock-file tools (uv, pip-audit) live in a venv of their own, made on first use.
SUPPLY := var/supply-chain-venv
UV_COMPILE = $(SUPPLY)/bin/uv pip compile pyproject.toml --universal --generate-hashes --python-version 3.11 \
	--index-url https://pypi.org/simple --no-config --no-header --quiet

.PHONY: help install run test test-agents test-browser format lint typecheck up bench bench-quick lock audit-deps \
	cluster cluster-stop test-cluster

help:
	@echo "make run        serve the demo on http://127.0.0.1:8000 (first run prints an admin login and an API key)"
	@echo "make test       run the whole test suite (Postgres when DATABASE_URL is set, else SQLite)"
	@echo "make test-agents   Claude Code, Codex, OpenCode, Qwen Code on a 10-step task at 30% corruption (npm; ~5 min)"
	@echo "make test-browser  screenshots of the admin at 1400 px in headless Chromium (var/browser/; installs chromium)"
	@echo "make install    create .venv and install toolrelay with its dev dependencies"
	@echo "make lint       ruff check"
	@echo "make format     ruff check --fix, then ruff format"
	@echo "make typecheck  mypy --strict with the django-stubs plugin"
	@echo "make up         docker compose up (needs a .env; see .env.example)"
	@echo "make lock       regenerate requirements/*.txt (hashed lock files) from pyproject.toml"
	@echo "make audit-deps pip-audit over the lock files (fails \"not checked\" when advisories cannot be reached, unless AUDIT_DEPS_ALLOW_UNCHECKED=1)"
	@echo "make bench      benchmark: direct, bare Channels relay, toolrelay, LiteLLM side by side (~8 min; docs/benchmarks.md)"
	@echo "make bench-quick  the same with small counts (~2 min)"
	@echo "make cluster    nginx on CLUSTER_PORT (8080) in front of 3 serve processes, journal writer, Celery, private Postgres and Redis (var/cluster/)"
	@echo "make cluster-stop  stop everything \`make cluster\` started"
	@echo "make test-cluster  the cluster under load: kill -9, rolling restart, Redis and Postgres outages, req/s per process (~4 min)"

install: $(STAMP)

$(VENV)/pyvenv.cfg:
	$(PYTHON) -m venv $(VENV)

# From the hashed lock file (requirements/dev.txt, `make lock`): every developer and CI machine gets the
# same versions, checked against their hashes; then the project itself, without resolving anything.
$(STAMP): pyproject.toml requirements/dev.txt $(VENV)/pyvenv.cfg
	$(BIN)/pip install --disable-pip-version-check --require-hashes -r requirements/dev.txt
	$(BIN)/pip install --disable-pip-version-check --no-deps -e .
	@mkdir -p var && touch $@

# Development secrets, made once and kept out of git (var/ is ignored). Settings never read this
# file: `make run` exports it into the environment, like any deployment would.
$(SECRETS):
	@mkdir -p var
	@umask 077 && $(BIN)/python -c 'import base64, os, secrets; \
	print("SECRET_KEY=" + secrets.token_urlsafe(50)); \
	print("CREDENTIAL_KEYS=" + base64.urlsafe_b64encode(os.urandom(32)).decode())' > $@.tmp
	@chmod 600 $@.tmp && mv $@.tmp $@
	@echo "Generated $@ (SECRET_KEY, CREDENTIAL_KEYS; mode 600). Keep it: the stored credentials need it."

run: $(STAMP) $(SECRETS)
	@set -a && . ./$(SECRETS) && set +a && exec scripts/run.sh

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# Not part of `make test`: the four real agents on the simulator's multi-step task, through toolrelay and
# direct (scripts/test_agents.py). Installs them from npm into $(AGENT_CACHE) (ignored by git) unless
# they are there. TEST_AGENTS_ARGS, e.g. "--budget-spent" or "--broken --steps 3" or "--agents claude".
AGENT_CACHE ?= var/agent-cache
test-agents: $(STAMP)
	AGENT_CACHE=$(AGENT_CACHE) $(BIN)/python scripts/test_agents.py $(TEST_AGENTS_ARGS)

# Not part of `make test`: the admin in Debian's headless Chromium at 1400 px (scripts/browser_check.py).
# Installs chromium and chromium-driver with apt-get when missing (as root, or through sudo), and
# selenium into .venv; screenshots go to var/browser/.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
test-browser: $(STAMP)
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  echo "Installing Debian's chromium and chromium-driver (apt-get)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium chromium-driver; \
	fi
	@$(BIN)/python -c 'import selenium' 2>/dev/null || $(BIN)/pip install --disable-pip-version-check -q -e '.[dev,browser]'
	$(BIN)/python scripts/browser_check.py

lint: $(STAMP)
	$(BIN)/ruff check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: $(STAMP)
	$(BIN)/mypy

up:
	@test -f .env || { echo "No .env: copy .env.example to .env and fill it in."; exit 1; }
	docker compose up --build

# Benchmarks (docs/benchmarks.md). The first run creates bench/.venv-litellm (LiteLLM 1.108.7, ~2 min).
bench: $(STAMP)
	$(BIN)/python bench/run.py --json var/bench/last.json

bench-quick: $(STAMP)
	$(BIN)/python bench/run.py --quick --json var/bench/last-quick.json

# Hashed lock files from pyproject.toml (the one place for ranges): runtime for the Docker image,
# dev for a reproducible development venv. `make install` still installs from pyproject.toml.
$(SUPPLY)/pyvenv.cfg: pyproject.toml
	$(PYTHON) -m venv $(SUPPLY)
	$(SUPPLY)/bin/pip install --disable-pip-version-check -q $$($(PYTHON) -c 'import tomllib; \
	print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["supply-chain"]))')
	@touch $@

lock: $(SUPPLY)/pyvenv.cfg
	@mkdir -p requirements
	$(UV_COMPILE) -o requirements/runtime.txt
	$(UV_COMPILE) --extra dev -o requirements/dev.txt

audit-deps:
	@if $(MAKE) -s $(SUPPLY)/pyvenv.cfg; then $(SUPPLY)/bin/python scripts/audit_deps.py; else \
		echo "audit-deps: NOT CHECKED: pip-audit cannot be installed here"; test "$$AUDIT_DEPS_ALLOW_UNCHECKED" = 1; fi

# A local cluster (docs/deployment.md, "make cluster"): scripts/cluster.py; everything under var/cluster/.
# test-cluster starts it if needed and leaves it running; TEST_CLUSTER_ARGS, e.g. "--concurrency 8 --phase 15".
cluster: $(STAMP) $(SECRETS)
	@set -a && . ./$(SECRETS) && set +a && $(BIN)/python scripts/cluster.py start

cluster-stop:
	@$(BIN)/python scripts/cluster.py stop

test-cluster: cluster
	@set -a && . ./$(SECRETS) && set +a && $(BIN)/python scripts/cluster_test.py $(TEST_CLUSTER_ARGS)
