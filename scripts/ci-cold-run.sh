#!/usr/bin/env bash
# Measures CI as a newcomer meets it: undoes what the project's scripts installed since boot, then runs
# `CI=true bash .ci/run` on a fresh clone of HEAD and writes what each part cost to
# docs/runs/<date>-<commit>-ci-cold.md (the README's cold-run minutes come from such a file).
#
#   sudo bash scripts/ci-cold-run.sh --yes [--keep-packages]
#
# Destructive, hence --yes. It purges the Debian packages the project's scripts install (their
# need_packages lists) that dpkg installed since this boot, whoever installed them, with the
# dependencies that came since boot and are left orphaned; nothing the machine had when it
# booted, and it refuses when apt would remove more. It also removes the
# musl and aarch64 Rust standard libraries and empties cargo's registry, Go's module and build caches,
# the real node's cache (/var/cache/sg-node) and pip's cache. --keep-packages leaves the
# packages (a run that measures only the builds). Run it with nothing else on the machine:
# the figures are what an idle machine shows. The run's whole output is kept (the path is
# printed) and the run file keeps every line that a figure comes from.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/packages.sh
help_if_asked "$0" 16 "${1:-}"
need_root "scripts/ci-cold-run.sh"

yes='' keep_packages=''
for arg in "$@"; do
  case $arg in
    --yes) yes=1 ;;
    --keep-packages) keep_packages=1 ;;
    *)
      echo "unknown argument '$arg' (see --help)" >&2
      exit 2
      ;;
  esac
done
[[ -n $yes ]] || {
  echo "this purges packages and empties caches machine-wide: rerun with --yes (see --help)" >&2
  exit 2
}
[[ -z $(git status --porcelain --untracked-files=no) ]] || {
  echo "commit first: the run measures HEAD, and the run file names its commit" >&2
  exit 2
}

# Read now: the run measures the clone made below, whatever HEAD becomes while it runs.
commit=$(git rev-parse --short HEAD)
commit_line=$(git log -1 --format='%H %s')
btime=$(awk '/^btime/ {print $2}' /proc/stat)
booted=$(date -u -d "@$btime" '+%Y-%m-%d %H:%M:%S')
# The packages the project's scripts install: the words of their need_packages calls and of
# build.sh's cross-toolchain lists.
project_packages() {
  sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' scripts/*.sh scripts/lib/*.sh | grep -v '^[[:space:]]*#' |
    grep -oE '(need_packages|packages=\()[^)#;|&]*' | sed -E 's/^(need_packages|packages=\()//' |
    tr -s ' \t' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | sort -u
}

# What dpkg installed since this boot (dpkg.log stamps local time, compared in the same form).
installed_since_boot() {
  local since
  since=$(date -d "@$btime" '+%Y-%m-%d %H:%M:%S')
  { [[ ! -e /var/log/dpkg.log.1 ]] || cat /var/log/dpkg.log.1; cat /var/log/dpkg.log; } |
    awk -v since="$since" '$3 == "install" && ($1 " " $2) >= since { sub(/:.*/, "", $4); print $4 }' |
    sort -u
}

# apt-get's simulated removals for ARGS..., one package a line.
apt_removals() {
  apt-get -s "$@" 2>/dev/null | awk '$1 == "Purg" || $1 == "Remv" {print $2}' | sort -u
}

purged=()
if [[ -z $keep_packages ]]; then
  since_boot=$(installed_since_boot)
  mapfile -t purged < <(comm -12 <(project_packages) <(echo "$since_boot") |
    while read -r pkg; do dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null |
      grep -q 'install ok installed' && echo "$pkg"; done)
  if ((${#purged[@]})); then
    beyond=$(comm -23 <(apt_removals purge "${purged[@]}") <(echo "$since_boot"))
    [[ -z $beyond ]] || {
      echo "purging ${purged[*]} would also remove what was there before this boot: $beyond" >&2
      exit 1
    }
    echo "purging what the scripts installed since this boot ($booted UTC): ${purged[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -q -o DPkg::Lock::Timeout=600 "${purged[@]}" >/dev/null
    # Their dependencies, orphaned now, that also came since boot; the image's own orphans stay.
    mapfile -t orphans < <(comm -12 <(apt_removals autoremove) <(echo "$since_boot"))
    if ((${#orphans[@]})); then
      DEBIAN_FRONTEND=noninteractive apt-get purge -y -q -o DPkg::Lock::Timeout=600 "${orphans[@]}" >/dev/null
      purged+=("${orphans[@]}")
    fi
  fi
fi
PATH="$HOME/.cargo/bin:$PATH"
# The release's musl triples and the cross build's: none is in a default toolchain.
for triple in x86_64-unknown-linux-musl aarch64-unknown-linux-musl aarch64-unknown-linux-gnu; do
  if rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
    rustup target remove "$triple" >&2
  fi
done
go_caches=()
if command -v go >/dev/null || [[ -x /usr/local/go/bin/go ]]; then
  go=$(command -v go || echo /usr/local/go/bin/go)
  go_caches=("$("$go" env GOCACHE)" "$("$go" env GOMODCACHE)")
  "$go" clean -modcache 2>/dev/null || true
fi
rm -rf "$HOME/.cargo/registry" "$HOME/.cargo/git" "${go_caches[@]}" /var/cache/sg-node "$HOME/.cache/pip"

work=$(mktemp -d /var/tmp/ci-cold-run.XXXXXX)
git clone -q --no-checkout . "$work/clone"
git -C "$work/clone" checkout -q "$commit"
log=$work/ci.log
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M:%S')
echo "running CI=true bash .ci/run in $work/clone (output: $log)" >&2
status=0
(cd "$work/clone" && CI=true bash .ci/run </dev/null >"$log" 2>&1) || status=$?
ended=$(date -u '+%Y-%m-%d %H:%M:%S')
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p docs/runs
out=docs/runs/$(date -u +%Y-%m-%d)-$commit-ci-cold.md
{
  echo "# Cold CI run of $commit: $([[ $status == 0 ]] && echo passed || echo "FAILED (exit $status)")"
  echo
  echo "Written by \`scripts/ci-cold-run.sh\`$([[ -n $keep_packages ]] && echo ' --keep-packages')."
  echo
  echo "- commit: $commit_line"
  echo "- run: $started to $ended UTC; machine booted $booted UTC; $(nproc) cores; load average $load_before before, $load_after after"
  echo "- emptied: cargo's registry and git checkouts, Go's module and build caches (${go_caches[*]:-none}), /var/cache/sg-node, pip's cache; the musl and aarch64 Rust standard libraries removed"
  echo "- packages purged first (the scripts' own installs since boot, with their orphaned dependencies): ${purged[*]:-none}"
  echo "- tools: $(rustc --version), $( (/usr/local/go/bin/go version || go version) 2>/dev/null | head -1)"
  echo
  echo "## Parts (the \`time:\` lines of .ci/run and scripts/test.sh)"
  echo
  echo '```'
  grep -E '^time: ' "$log" || true
  echo '```'
  echo
  echo "## Every step, node build and test binary (lines of the output, verbatim)"
  echo
  echo '```'
  grep -E '^(==> |time: |CI FAILED)|^ *Running |^test result: |node: built |node: up in |^failures:|panicked at' "$log" || true
  echo '```'
} >"$out"
echo "wrote $out; the whole output stays in $log" >&2
exit "$status"
