#!/usr/bin/env bash
# Runs every test: unit tests, the CNI protocol, concurrency, crash and ENOSPC tests, and the
# end-to-end suites under real libcni, containerd's CRI and podman. Needs root (namespaces,
# links, a private containerd); installs the Debian packages it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/packages.sh

need_root "scripts/test.sh"
need_cargo
need_packages iproute2 iputils-ping util-linux \
  containernetworking-plugins golang-go golang-github-appc-cni-dev \
  containerd runc catatonit protobuf-compiler \
  podman

# One test process at a time per binary keeps the kernel-touching suites from racing each
# other for the same names and keeps the timing of the crash test honest on 2 cores.
cargo test --release --no-fail-fast -- --test-threads=1
