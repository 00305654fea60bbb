#!/bin/sh
# Puts a state dir back in the form of the release before the pod key (podKey), so that it
# can take the node over: owners, deferred DELs and the refusal ledger moved to that release's
# keys (by pod name and ifname), records, ownerships and address index entries rewritten from
# symlinks (this release's form, which it refuses) into regular files. The work is this release's
# `--downgrade`, under the store's lock, crash-safe: run again, it finishes what a crash left.
#
#   sh scripts/downgrade-owners.sh [STATE_DIR [THIS_RELEASES_BINARY]]
#       # defaults /var/lib/cni/sandbox-guard and /opt/cni/bin/sandbox-guard
#
# The order: copy this release's two binaries aside into one dir (sandbox-guard and the
# sandbox-guard-ctl beside it, which runs --downgrade), run this script with that copy of
# sandbox-guard, install the older binary, run the script again with the copy. A verb of this release that ran between
# the first run and the install moved files back to its keys; the second run moves them again.
set -eu
state_dir=${1:-/var/lib/cni/sandbox-guard}
binary=${2:-/opt/cni/bin/sandbox-guard}
[ -d "$state_dir" ] || { echo "no state dir at $state_dir" >&2; exit 1; }
# Its stderr stays: a missing sandbox-guard-ctl beside it says so there.
"$binary" --help | grep -q -- '--downgrade' ||
    { echo "$binary has no --downgrade: give this release's binary (the one going away), with its sandbox-guard-ctl beside it" >&2; exit 1; }
exec "$binary" --downgrade --state-dir "$state_dir"
