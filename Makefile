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

.PHONY: help install run test format lint typecheck up bench bench-quick lock audit-deps

help:
	@echo "make run        serve the demo on http://127.0.0.1:8000 (first run prints an admin login and an API key)"
	@echo "make test       run the whole test suite (Postgres when DATABASE_URL is set, else SQLite)"
	@echo "make install    create .venv and install toolrelay with its dev dependencies"
	@echo "make lint       ruff check"
	@echo "make format     ruff check --fix, then ruff format"
	@echo "make typecheck  mypy --strict with the django-stubs plugin"
	@echo "make up         docker compose up (needs a .env; see .env.example)"
	@echo "make lock       regenerate requirements/*.txt (hashed lock files) from pyproject.toml"
	@echo "make audit-deps pip-audit over the lock files (says \"skipped\" when advisories cannot be reached)"
	@echo "make bench      benchmark: direct, bare Channels relay, toolrelay, LiteLLM side by side (~8 min; docs/benchmarks.md)"
	@echo "make bench-quick  the same with small counts (~2 min)"

install: $(STAMP)

$(VENV)/pyvenv.cfg:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml $(VENV)/pyvenv.cfg
	$(BIN)/pip install --disable-pip-version-check -e '.[dev]'
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
	@$(MAKE) -s $(SUPPLY)/pyvenv.cfg || { echo "audit-deps: skipped: pip-audit cannot be installed here"; exit 0; }
	@$(SUPPLY)/bin/python scripts/audit_deps.py
