#!/bin/sh
# Rewrites a state dir's ownerships and address index entries from symlinks (this release's
# form) back into the regular files releases before it read, so that one of those can take
# the node over. Those releases refuse a symlink in the state dir (code 5 on every ADD and DEL
# of the pod) and say "remove the link": that would drop the pod's owner and let the stale DEL
# through. Run it right before the downgrade; it holds the store's lock while it works, and an
# ADD or DEL of this release after it makes symlinks again.
#
#   sh scripts/downgrade-owners.sh [STATE_DIR]     # default /var/lib/cni/sandbox-guard
set -eu
state_dir=${1:-/var/lib/cni/sandbox-guard}
[ -f "$state_dir/lock" ] || { echo "no state dir at $state_dir" >&2; exit 1; }
exec flock "$state_dir/lock" sh -eu -c '
  for dir in "$1/owners" "$1/ips"; do
    [ -d "$dir" ] || continue
    for entry in "$dir"/*; do
      [ -L "$entry" ] || continue
      # A link that holds no sealed text was not written by the store: left for the operator.
      case "$(readlink "$entry")" in "{"*) ;; *) echo "left alone, not a sealed text: $entry" >&2; continue ;; esac
      name=${entry##*/}
      temp="$dir/.downgrade.$$.tmp"
      # The target is the sealed text the regular file held, without its newline.
      printf "%s\n" "$(readlink "$entry")" > "$temp"
      chmod 600 "$temp"
      sync "$temp"
      mv -f "$temp" "$entry"
      echo "rewrote $name"
    done
    sync "$dir"
  done
' sh "$state_dir"
