# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# buf (proto lint) comes from the npm registry; kept inside the venv so `clean` removes it.
BUF_VERSION ?= 1.75.0
BUF := $(VENV)/buf/node_modules/.bin/buf

.PHONY: demo test lint install buf clean

$(BIN)/llmgw-server: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/llmgw-server

$(BUF):
	npm install --silent --no-save --no-package-lock --prefix $(VENV)/buf @bufbuild/buf@$(BUF_VERSION)

buf: $(BUF)

demo: install
	$(BIN)/llmgw-server --demo

test: install
	scripts/test_deps.sh
	$(BIN)/pytest -q

lint: install $(BUF)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BUF) lint proto
	# No breaking change since the protocol first landed: field numbers are never reused.
	$(BUF) breaking proto --against ".git#ref=$$(git log --diff-filter=A --format=%H -- proto/llmgw/agent/v1/agent.proto | tail -1),subdir=proto"
	$(BIN)/python scripts/gen_proto.py --check

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
