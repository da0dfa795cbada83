# Two commands on a fresh clone: `make demo` and `make test` (see README).
# Both create or refresh .venv from requirements.lock when needed, and are quick when it is current.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

CHROMIUM := /usr/bin/chromium
# The benchmark peers of `lakefold bench nexmark` and `bench capture`: PyFlink in a virtualenv
# of its own (it pins an older pyarrow and py4j than lakefold's), and the jars Maven fetches
# once into a cache the project controls (Flink's Parquet format; Debezium's embedded engine).
FLINK_VENV := .venv-flink
FLINK_STAMP := $(FLINK_VENV)/.installed
PEER_JARS := $(HOME)/.cache/lakefold/peers

.PHONY: demo test lint lock clean browser peers

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check 'uv>=0.5'
	@$(BIN)/uv pip sync -q --compile-bytecode --python $(BIN)/python requirements.lock
	@$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lakefold demo

test: $(STAMP) browser peers
	$(BIN)/python -m pytest

peers: $(FLINK_STAMP) $(PEER_JARS)/flink/.fetched $(PEER_JARS)/debezium/.fetched \
	$(PEER_JARS)/delta-spark/.fetched $(PEER_JARS)/hadoop-aws/.fetched

$(FLINK_STAMP): infra/peers/flink/requirements.lock $(STAMP)
	@test -x $(FLINK_VENV)/bin/python || $(BIN)/uv venv -q --python $(PY) $(FLINK_VENV)
	@$(BIN)/uv pip sync -q --python $(FLINK_VENV)/bin/python infra/peers/flink/requirements.lock
	@touch $(FLINK_STAMP)

$(PEER_JARS)/%/.fetched: infra/peers/%/pom.xml
	@rm -rf $(PEER_JARS)/$*
	@mvn -q -B -f infra/peers/$*/pom.xml dependency:copy-dependencies \
		-DoutputDirectory=$(PEER_JARS)/$* -DincludeScope=runtime
	@touch $@

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
	$(BIN)/uv pip compile -q --no-header --extra dev --extra bench --python-version 3.11 pyproject.toml -o requirements.lock

clean:
	rm -rf $(VENV) $(FLINK_VENV) .typecheck
