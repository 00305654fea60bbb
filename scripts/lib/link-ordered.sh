#!/usr/bin/env bash
# The x86_64 static build's linker (.cargo/static.toml): cc as rustc calls it. For the plugin's
# own binary it adds lld's symbol ordering file, so that the functions the CNI verbs run
# (scripts/lib/hot-functions.txt, made by scripts/hot-functions.sh) come together at the start
# of .text. The runtime execs the binary for every pod start and stop, and the kernel maps its
# code a 64 KiB run at a fault: spread over the whole binary, the few hundred functions a verb
# runs kept most of its code resident and faulted in a run at a time.
#
# The list names functions demangled (v0 mangling: one name an instance of a generic function,
# and no hash), so it holds across builds; each name is matched to the symbols of the .o
# objects being linked (with the release profile's LTO, one object that holds every crate's
# code; a build without LTO orders only its own crate's), and a name no longer found is passed
# over, as is a function missing from the list (linked as before, only further on).
# Whatever cannot be ordered is linked plainly: other outputs (build scripts, proc macros, the
# integration tests; the crate's unit tests are ordered too), a link not made by lld (rustc
# links x86_64 with lld from Rust 1.90), arguments in a response file, or an nm that fails.
set -uo pipefail
list=$(dirname "${BASH_SOURCE[0]}")/hot-functions.txt
objects=() lld=0 ours=0 expect_output=0
for arg in "$@"; do
  if ((expect_output)); then
    [[ $(basename -- "$arg") == sandbox_guard-* ]] && ours=1
    expect_output=0
  fi
  case $arg in
  -o) expect_output=1 ;;
  -fuse-ld=lld) lld=1 ;;
  *.o) objects+=("$arg") ;;
  esac
done
if ((!ours || !lld)) || ((${#objects[@]} == 0)) || [[ ! -r $list ]] || ! command -v nm >/dev/null ||
  ! order=$(mktemp); then
  exec cc "$@"
fi
trap 'rm -f "$order"' EXIT

# Per object, its symbols mangled and demangled, one a line in the same order, side by side.
symbols() {
  local object mangled demangled
  for object in "${objects[@]}"; do
    mangled=$(nm --defined-only --format=just-symbols -- "$object") || return 1
    demangled=$(nm --defined-only --format=just-symbols --demangle -- "$object") || return 1
    [[ $(wc -l <<<"$mangled") == $(wc -l <<<"$demangled") ]] || return 1
    paste -d '\t' <(printf '%s\n' "$mangled") <(printf '%s\n' "$demangled")
  done
}
# The mangled names in the list's order; a plain C name with no symbol here (glibc's, from
# libc.a) is passed as it is.
ordered() {
  awk -F '\t' -v list="$list" '
    BEGIN {
      while ((getline name < list) > 0) {
        sub(/\r$/, "", name)
        if (name == "" || name ~ /^#/) continue
        n++
        names[n] = name
        rank[name] = n
      }
    }
    ($2 in rank) { found[rank[$2]] = found[rank[$2]] $1 "\n" }
    END {
      for (i = 1; i <= n; i++) {
        if (i in found) printf "%s", found[i]
        else if (names[i] ~ /^[A-Za-z_][A-Za-z0-9_.]*$/) print names[i]
      }
    }'
}
if symbols | ordered >"$order" && [[ -s $order ]]; then
  cc "$@" "-Wl,--symbol-ordering-file=$order" -Wl,--no-warn-symbol-ordering
else
  cc "$@"
fi
