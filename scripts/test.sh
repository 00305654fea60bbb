#!/usr/bin/env bash
# Runs every test: unit tests, the CNI protocol, concurrency, crash and ENOSPC tests, and the
# end-to-end suites under real libcni, containerd's CRI, podman and the real node, against the
# static release binary; first, the static release for the other arch's nodes, cross-built and
# run under qemu-user. Needs root (namespaces, links, a private containerd); installs the Debian
# packages it needs.
#
#   bash scripts/test.sh          # what CI runs (.ci/run), within its cold-run budget (README)
#   bash scripts/test.sh --long   # only the long run: the real-node tests CI leaves out
#                                 # (#[ignore = "long run: ..."]), whose results are published
#                                 # in docs/runs/
#   bash scripts/test.sh --long NAME   # only the real-node tests whose names contain NAME,
#                                      # CI's too, published the same way
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/packages.sh
. scripts/lib/build.sh
help_if_asked "$0" 13 "${1:-}"
long=''
only=''
case ${1:-} in
  --long)
    long=1
    only=${2:-}
    ;;
  '') ;;
  *)
    echo "unknown argument '$1' (see --help)" >&2
    exit 2
    ;;
esac

need_root "scripts/test.sh"
need_cargo
# Every package a test asks for a tool of (tests/support/packages.rs maps each tool to its
# package; tests/packages.rs fails when one is missing here), even those a Debian base has.
timed "Debian packages" need_packages bash coreutils dash grep sed procps tar git mount util-linux \
  iproute2 iputils-ping strace containernetworking-plugins golang-go golang-github-appc-cni-dev \
  containerd runc catatonit conmon protobuf-compiler curl openssl \
  podman qemu-user python3-minimal python3-prometheus-client binutils docker-registry python3-venv \
  tcpdump e2fsprogs xfsprogs

# The manifests' schema test (tests/manifests.rs) runs PyPI's kubernetes-validate, which
# Debian does not package, from a virtualenv of its own; no pip here stops the tests.
kubernetes_validate() {
  [ -x target/python/bin/kubernetes-validate ] && return 0
  python3 -m venv target/python
  target/python/bin/pip install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0'
}
timed "PyPI's kubernetes-validate" kubernetes_validate

# The real-node tests' tables (target/real-node-*.md), published as they wrote them, passing or
# failing: docs/runs/<date>-<commit>-<suffix>.md. A runtime's tests mark their tables passed only
# once every assertion held (target/real-node-<runtime>.passed).
publish_node_run() {
  local suffix=$1 title=$2 command=$3 status=$4 out table base
  compgen -G 'target/real-node-*.md' >/dev/null || return 0
  mkdir -p docs/runs
  out=docs/runs/$(date -u +%Y-%m-%d)-$(git rev-parse --short HEAD)-$suffix.md
  {
    echo "# $title: $([[ $status == 0 ]] && echo passed || echo "FAILED (exit $status)")"
    echo
    echo "\`$command\`, $(date -u '+%Y-%m-%d %H:%M') UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)$([[ -z $(git status --porcelain --untracked-files=no) ]] || echo ', with uncommitted changes')."
    for table in target/real-node-*.md; do
      base=$(basename "$table" .md)
      printf '\n## %s\n\n' "$base"
      if [[ -e target/$base.passed ]]; then
        printf 'Its assertions held.\n\n'
      elif compgen -G 'target/real-node-*.passed' >/dev/null || [[ $status != 0 ]]; then
        printf 'Its assertions did NOT all hold, or the test did not finish (see the test output).\n\n'
      fi
      cat "$table"
    done
  } >"$out"
  echo "wrote $out" >&2
}

host=$(plugin_arch)
# The tests run the binaries the nodes get, static musl builds for this machine's arch.
timed "the musl toolchain (musl-tools, rustup's standard library)" need_host_musl_build || {
  echo "the toolchain for the static $host build is missing (its message is above)" >&2
  exit 1
}
# The tests run the binaries the nodes get: the static release for this machine's arch,
# built once here and named to every test in SANDBOX_GUARD_RELEASE_DIR (tests/support/cni.rs).
# The test binaries are cargo test's own debug build: under the release profile each of them
# was linked with fat LTO, about half of the test build's time for nothing the tests exec
# (docs/runs/2026-12-07-e25c2a9-test-build-profiles.md).
build_tested() {
  local bin
  bin=$(SUDO_USER='' build_plugin . "$host") || return 1
  SANDBOX_GUARD_RELEASE_DIR=$(dirname "$bin")
  export SANDBOX_GUARD_RELEASE_DIR
}
timed "the static release for $host, which the tests run" build_tested || {
  echo "the static $host release build failed (its messages are above)" >&2
  exit 1
}
tests=(cargo test --no-fail-fast --config .cargo/static.toml --target "$(plugin_triple "$host")")
if [[ -n $long ]]; then
  timed "the node's Go builds" bash -c 'bash scripts/node.sh build --runtime containerd2 &&
    bash scripts/node.sh build --runtime containerd16'
  rm -f target/real-node-*.md target/real-node-*.passed
  status=0
  timed "the long run" "${tests[@]}" --test e2e_node -- "--${only:+include-}ignored" --test-threads=1 ${only:+"$only"} || status=$?
  publish_node_run "long${only:+-$only}" "Long run of $(git rev-parse --short HEAD)${only:+ (tests named *$only*)}" \
    "bash scripts/test.sh --long${only:+ $only}" "$status"
  exit "$status"
fi

# The other arch's nodes (arm64 on an x86_64 machine) get a binary built from these same
# files: build it static, as scripts/build.sh does, and run its VERSION under qemu-user. A
# build or a run that fails stops the tests; nothing here is skipped. Adds about two minutes
# to a fresh run (Debian's cross gcc, then a release build of every crate for the target).
# Built as root, like the tests below.
case $host in
  x86_64) other=arm64 ;;
  arm64) other=x86_64 ;;
esac
other_started=$SECONDS
other_bin=$(SUDO_USER='' build_plugin . "$other") || {
  echo "the static $other build failed" >&2
  exit 1
}
version=$(CNI_COMMAND=VERSION "$(qemu_user "$other")" "$other_bin" <<<'{}') || {
  echo "the static $other build failed to answer VERSION under $(qemu_user "$other")" >&2
  exit 1
}
if [[ $version != *'"supportedVersions"'* ]]; then
  echo "the static $other build answered VERSION with: $version" >&2
  exit 1
fi
# The operator's binary beside it, run directly: the plugin's exec of it would not go through
# qemu-user.
"$(qemu_user "$other")" "$(dirname "$other_bin")/sandbox-guard-ctl" --version || {
  echo "the static $other build's sandbox-guard-ctl failed to answer --version under $(qemu_user "$other")" >&2
  exit 1
}
echo "static $other build answers VERSION under $(qemu_user "$other"): $version"
echo "time: the static $other build, with its cross gcc: $((SECONDS - other_started)) s" >&2

# The real node's components, built from the Go module proxy into the node's cache (a stamp
# per component: nothing to do once built). Built here, before the Rust tests, so that their
# cost shows apart from the node suite's. Under CI=true a failed build ends the run here (each
# real-node test would retry it); elsewhere the other suites still run and the real-node tests
# fail, saying why.
if ! timed "the node's Go builds" bash scripts/node.sh build --runtime containerd2; then
  [[ ${CI:-} != true ]] || {
    echo "the node's Go builds failed: under CI=true the run stops here" >&2
    exit 1
  }
  echo "the node's Go builds failed: the real-node tests will fail and say why" >&2
fi

# One test process at a time per binary keeps the kernel-touching suites from racing each
# other for the same names and keeps the timing of the crash test honest on 2 cores.
timed "the Rust test build" "${tests[@]}" --no-run
rm -f target/real-node-*.md target/real-node-*.passed
# The output is kept (target/tests.log) and, when a test fails, its panics end the run's
# output: CI keeps only the head and the tail of what a run prints, and its clone is gone.
run_tests() {
  "${tests[@]}" -- --test-threads=1 2>&1 | tee target/tests.log
  return "${PIPESTATUS[0]}"
}
status=0
timed "the tests" run_tests || status=$?
publish_node_run nodes "The real-node tests of $(git rev-parse --short HEAD) in the test run" \
  "bash scripts/test.sh" "$status"
if ((status != 0)); then
  echo "== the tests failed (whole output: target/tests.log); the failing ones and their panics:" >&2
  grep -E '^test .* FAILED$|^error: .*|^    `--test ' target/tests.log >&2 || true
  grep -A3 "panicked at" target/tests.log | cut -c1-4000 >&2 || true
  exit "$status"
fi

