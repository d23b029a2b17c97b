# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# buf (proto lint) comes from the npm registry; kept inside the venv so `clean` removes it.
BUF_VERSION ?= 1.75.0
BUF := $(VENV)/buf/node_modules/.bin/buf

.PHONY: demo test test-unit fuzz lint install buf docs image clean

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

# The in-process tests only (tests/conftest.py marks them): ~2 minutes, not ~22.
test-unit: install
	$(BIN)/pytest -q -m unit

# The property tests only, with random draws and 20x their example budgets
# (tests/properties.py); `make test` runs them derandomized.
fuzz: install
	$(BIN)/pytest -q --hypothesis-profile=fuzz $$(grep -l '^from hypothesis\|^import hypothesis' tests/test_*.py)

lint: install $(BUF)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BUF) lint proto
	# No breaking change since the protocol first landed (field numbers are never reused),
	# nor since the commit before the last change to proto/ (removing what came later).
	# Both need the history: a shallow clone (CI's default checkout) is deepened first.
	@if [ "$$(git rev-parse --is-shallow-repository)" = true ]; then \
	  echo "buf breaking: shallow clone; fetching the full history to compare proto/"; \
	  git fetch --quiet --unshallow && [ "$$(git rev-parse --is-shallow-repository)" = false ] || \
	    { echo "buf breaking: cannot fetch the history of this shallow clone (no remote?); clone with full history (actions/checkout: fetch-depth: 0)" >&2; exit 1; }; \
	fi; \
	for ref in $$( { git log --diff-filter=A --format=%H -- proto/llmgw/agent/v1/agent.proto | tail -1; \
	               git log -2 --format=%H -- proto/ | sed -n 2p; } | sort -u); do \
	  echo "buf breaking proto against $$ref"; \
	  $(BUF) breaking proto --against ".git#ref=$$ref,subdir=proto" || exit 1; \
	done
	$(BIN)/python scripts/gen_proto.py --check

# The generated parts of the docs: the configuration reference in docs/operations.md
# (tests/test_config_reference.py fails when it is stale).
docs: install
	$(BIN)/python -m llmgw.config_reference --write docs/operations.md

# llmgw-server's image (Containerfile) with podman: on IMAGE_BASE, by default a Debian
# bookworm with Debian's python3 that scripts/image_base.sh makes with debootstrap
# (as root) when it is missing; `make image IMAGE_BASE=docker.io/library/python:3.11-slim`
# builds on a registry's image instead. --format docker keeps the HEALTHCHECK; the
# build reaches the package index through the host's network and trusts the host's
# CAs (IMAGE_CA, mounted over the build's bundle; empty: the base's own).
PODMAN ?= podman
IMAGE ?= localhost/llmgw:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_BASE ?= localhost/llmgw-base:bookworm
IMAGE_CA ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
IMAGE_BUILD_FLAGS ?=

image:
	@if [ "$(IMAGE_BASE)" = localhost/llmgw-base:bookworm ] && ! $(PODMAN) image exists $(IMAGE_BASE); then \
	  PODMAN="$(PODMAN)" scripts/image_base.sh $(IMAGE_BASE); \
	fi
	$(PODMAN) build --format docker --network=host --build-arg BASE=$(IMAGE_BASE) \
	  $(if $(IMAGE_CA),--volume $(IMAGE_CA):/etc/ssl/certs/ca-certificates.crt:ro) \
	  $(IMAGE_BUILD_FLAGS) --tag $(IMAGE) .

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
