#!/usr/bin/env bash
# Builds tests/libcni-driver offline against Debian's libcni (golang-github-appc-cni-dev), which
# is the library containerd and CRI-O run CNI plugins through; no module proxy is needed because
# libcni has no third-party dependencies.
# Usage: scripts/build-libcni-driver.sh OUTPUT_DIR [GOPATH [PROGRAM]]   -> OUTPUT_DIR/PROGRAM
# PROGRAM: a Go program under tests/ (default libcni-driver; libcni-convert prints libcni's
# own conversion of a result to another CNI version).
# GOPATH: a tree holding src/github.com/containernetworking/cni, e.g. a vendored libcni 1.3
# (what containerd 2.1 and CRI-O 1.33 link, which appends <confdir>/<network>/*.conf drop-ins);
# default Debian's /usr/share/gocode (libcni 1.1).
set -euo pipefail
out_dir=${1:?usage: $0 OUTPUT_DIR [GOPATH [PROGRAM]]}
program=${3:-libcni-driver}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
gocode=${2:-}
gocode=$(cd "${gocode:-/usr/share/gocode}" && pwd)
[[ -d $gocode/src/github.com/containernetworking/cni/libcni ]] ||
	{ echo "libcni source missing in $gocode (Debian's: apt-get install golang-github-appc-cni-dev)" >&2; exit 1; }
# An empty private GOPATH entry first keeps go from writing into the packaged tree; a private
# GOCACHE lets root (sudo) and the invoking user build without sharing a cache.
gopath=$(mktemp -d)
trap 'rm -rf "$gopath"' EXIT
cd "$repo/tests/$program"
# Build under a private name and rename, so a concurrent build never leaves a half-written binary.
GO111MODULE=off GOPROXY=off GOFLAGS='' GOPATH="$gopath:$gocode" GOCACHE="${GOCACHE:-$out_dir/.gocache}" \
	go build -o "$out_dir/.$program.$$" .
mv -f "$out_dir/.$program.$$" "$out_dir/$program"
