#!/bin/sh
# What benchmarks/router_overhead.py compares llmgw against, installed apart from llmgw:
#
#   * benchmarks/.venv-peers: a venv of its own with PyPI's vllm-router and
#     sglang-router (Rust routers shipped in wheels; their Python modules, vllm_router
#     and sglang_router, their commands and their dependencies do not clash), never in
#     llmgw's own dependencies;
#   * wrk, Debian's package, the independent load generator of the non-streaming phase.
#
# Usage: benchmarks/setup_peers.sh            (idempotent; re-run to change a version)
# Environment: PYTHON (default python3); VLLM_ROUTER_VERSION (default 0.1.17, the one
# the recorded runs used) and SGLANG_ROUTER_VERSION (default 0.3.2); "latest" for
# whatever PyPI serves.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv-peers"
python=${PYTHON:-python3}
vllm_version=${VLLM_ROUTER_VERSION:-0.1.17}
sglang_version=${SGLANG_ROUTER_VERSION:-0.3.2}

spec() { # spec NAME VERSION: a pip requirement
    if [ "$2" = latest ]; then echo "$1"; else echo "$1==$2"; fi
}

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# One resolve for both, so that neither upgrades a dependency under the other.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "$(spec vllm-router "$vllm_version")" "$(spec sglang-router "$sglang_version")"
"$venv/bin/python" -m pip check --disable-pip-version-check >/dev/null \
    || { "$venv/bin/python" -m pip check; exit 1; }
for dist in vllm-router sglang-router; do
    echo "$dist $("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$dist'))") in $venv"
done

if command -v wrk >/dev/null 2>&1; then
    echo "wrk: $(command -v wrk)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y wrk || { apt-get update && apt-get install -y wrk; }
else
    echo "wrk is missing: install Debian's package as root: apt-get install -y wrk" >&2
    exit 1
fi
