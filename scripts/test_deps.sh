#!/usr/bin/env bash
# The programs beyond pip's reach that the test suite drives for real, installed when
# missing and possible; `make test` runs this first.
#
#   PostgreSQL's server binaries  tests/pg_cluster.py starts a throwaway cluster (store tests)
#   Chromium                      tests/test_dashboard_browser.py (headless, via Playwright)
#   Prometheus (and promtool)     tests/test_prometheus.py scrapes a live llmgw-server and
#                                 checks deploy/prometheus and deploy/grafana against it
#   llama.cpp's llama-server      tests/test_llamacpp_fleet.py (scripts/llama_server.sh
#                                 builds it once, ~10 minutes on 2 cores, and caches it)
#   systemd-analyze               tests/test_systemd_units.py verifies deploy/systemd
#   podman, runc, debootstrap     tests/test_image.py builds the image (`make image`: a
#                                 Debian base made with debootstrap, ~2 minutes once per
#                                 machine) and runs llmgw-server in it
#
# Debian's packages are installed with apt-get when running as root (as CI does);
# otherwise what is missing is named with the command that installs it, and the tests
# that need it fail saying so. Exits non-zero only when an installation was tried and
# failed.
set -uo pipefail
cd "$(dirname "$0")/.."

packages=()
if [[ -z "${LLMGW_PG_BIN:-}" ]] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  packages+=(postgresql)
fi
command -v chromium >/dev/null 2>&1 || packages+=(chromium)
command -v systemd-analyze >/dev/null 2>&1 || packages+=(systemd)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || packages+=(prometheus)
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || packages+=("$tool")
done

if [[ ${#packages[@]} -gt 0 ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "test_deps.sh: installing ${packages[*]} with apt-get" >&2
    apt-get update -qq >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >&2 ||
      { echo "test_deps.sh: apt-get install ${packages[*]} failed" >&2; exit 1; }
  else
    echo "test_deps.sh: missing ${packages[*]}; tests that need them will fail." \
      "Install with: sudo apt-get install ${packages[*]}" >&2
  fi
fi

if ! scripts/llama_server.sh >/dev/null; then
  echo "test_deps.sh: no llama-server; tests/test_llamacpp_fleet.py will fail." \
    "See scripts/llama_server.sh" >&2
  [[ $(id -u) -eq 0 ]] && exit 1
fi
exit 0
