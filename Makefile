# Two commands on a fresh clone: `make demo` and `make test` (see README).
# Both create or refresh .venv from requirements.lock when needed, and are quick when it is current.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

CHROMIUM := /usr/bin/chromium

.PHONY: demo test lint lock clean browser

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check 'uv>=0.5'
	@$(BIN)/uv pip sync -q --compile-bytecode --python $(BIN)/python requirements.lock
	@$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lakefold demo

test: $(STAMP) browser
	$(BIN)/python -m pytest

# The console's browser tests drive Debian's Chromium through Playwright (Playwright's own
# browser download cannot work offline); installed here when missing (needs root, as CI is).
browser:
	@test -x $(CHROMIUM) || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python infra/typecheck_tree.py
	$(BIN)/mypy

# Re-resolve the pinned dependency set after editing pyproject.toml.
lock:
	@test -x $(BIN)/uv || { $(PY) -m venv $(VENV) && $(BIN)/python -m pip install -q 'uv>=0.5'; }
	$(BIN)/uv pip compile -q --no-header --extra dev --python-version 3.11 pyproject.toml -o requirements.lock

clean:
	rm -rf $(VENV) .typecheck
