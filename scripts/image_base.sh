#!/usr/bin/env bash
# The default base of llmgw's image (Containerfile's BASE): Debian bookworm, the
# minimal variant, with Debian's python3 (3.11), its venv module and the CA
# certificates, built here with debootstrap and imported into podman's local storage
# as TAG (default localhost/llmgw-base:bookworm). No container registry is needed:
# debootstrap fetches Debian's packages from the mirror this host's apt uses (else
# debootstrap's default). `make image` runs this when the base is missing; to build on
# a registry's image instead: make image IMAGE_BASE=docker.io/library/python:3.11-slim
#
#   scripts/image_base.sh [TAG]     as root (debootstrap), with debootstrap and podman
#
# About 75 s on 2 cores, ~110 MB; run again to refresh it with Debian's updates.
set -euo pipefail
tag=${1:-localhost/llmgw-base:bookworm}
podman=${PODMAN:-podman}
suite=bookworm

for tool in debootstrap "$podman"; do
  command -v "$tool" >/dev/null 2>&1 ||
    { echo "image_base.sh: $tool not found (Debian: apt-get install debootstrap podman)" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "image_base.sh: debootstrap needs root" >&2; exit 1; }

# The first Debian mirror of this host's apt sources (deb822 or one-line), if any.
mirror=$(
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'
  } | grep -v -- '-security' | grep '/debian/\?$' | head -1 || true
)

root=$(mktemp -d /var/tmp/llmgw-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "image_base.sh: debootstrap $suite into $root${mirror:+ from $mirror}" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$suite" "$root" ${mirror:+"$mirror"} >"$root.log" 2>&1 ||
  { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# What an image does not need: package lists and caches (apt-get update refetches),
# documentation, man pages.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
tar -C "$root" --numeric-owner -c . |
  "$podman" import --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' - "$tag" >/dev/null
echo "image_base.sh: $tag" >&2
