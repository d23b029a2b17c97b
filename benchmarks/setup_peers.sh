#!/bin/sh
# What benchmarks/router_overhead.py compares llmgw against, installed apart from llmgw:
#
#   * benchmarks/.venv-peers: a venv of its own with PyPI's vllm-router (a Rust router
#     shipped in a wheel), never in llmgw's own dependencies;
#   * wrk, Debian's package, the independent load generator of the non-streaming phase.
#
# Usage: benchmarks/setup_peers.sh            (idempotent; re-run to change the version)
# Environment: PYTHON (default python3), VLLM_ROUTER_VERSION (default 0.1.17, the one
# the recorded runs used; "latest" for whatever PyPI serves).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv-peers"
python=${PYTHON:-python3}
version=${VLLM_ROUTER_VERSION:-0.1.17}

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
if [ "$version" = latest ]; then
    spec=vllm-router
else
    spec="vllm-router==$version"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
echo "vllm-router $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-router"))') in $venv"

if command -v wrk >/dev/null 2>&1; then
    echo "wrk: $(command -v wrk)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y wrk || { apt-get update && apt-get install -y wrk; }
else
    echo "wrk is missing: install Debian's package as root: apt-get install -y wrk" >&2
    exit 1
fi
