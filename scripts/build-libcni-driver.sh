#!/usr/bin/env bash
# Builds tests/libcni-driver offline against Debian's libcni (golang-github-appc-cni-dev), which
# is the library containerd and CRI-O run CNI plugins through; no module proxy is needed because
# libcni has no third-party dependencies.
# Usage: scripts/build-libcni-driver.sh OUTPUT_DIR   -> OUTPUT_DIR/libcni-driver
set -euo pipefail
out_dir=${1:?usage: $0 OUTPUT_DIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
gocode=/usr/share/gocode
[[ -d $gocode/src/github.com/containernetworking/cni/libcni ]] ||
	{ echo "libcni source missing: apt-get install golang-github-appc-cni-dev" >&2; exit 1; }
# An empty private GOPATH entry first keeps go from writing into the packaged tree; a private
# GOCACHE lets root (sudo) and the invoking user build without sharing a cache.
gopath=$(mktemp -d)
trap 'rm -rf "$gopath"' EXIT
cd "$repo/tests/libcni-driver"
# Build under a private name and rename, so a concurrent build never leaves a half-written binary.
GO111MODULE=off GOPROXY=off GOFLAGS='' GOPATH="$gopath:$gocode" GOCACHE="${GOCACHE:-$out_dir/.gocache}" \
	go build -o "$out_dir/.libcni-driver.$$" .
mv -f "$out_dir/.libcni-driver.$$" "$out_dir/libcni-driver"
