#!/usr/bin/env bash
# Builds the release binaries, statically linked, for x86_64 or arm64 nodes (default: this
# machine's arch), and prints the plugin's path, target/<triple>/release/sandbox-guard, with
# the operator's sandbox-guard-ctl beside it.
#
#   bash scripts/build.sh [x86_64|arm64]
#
# The binaries are static musl builds (scripts/lib/build.sh says why). A build installs what it
# needs first (as root; a user is told the packages): Debian's musl-tools, or for the other arch
# Debian's cross gcc, and rustup's standard library for the target.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/lib/packages.sh"
. "$repo/scripts/lib/build.sh"

help_if_asked "${BASH_SOURCE[0]}" 9 "${1:-}"
if (($# > 1)); then
  echo "usage: bash scripts/build.sh [x86_64|arm64]" >&2
  exit 2
fi
arch=$(plugin_arch "${1:-}") || exit 2
build_plugin "$repo" "$arch"
