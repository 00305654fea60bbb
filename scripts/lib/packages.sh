# Sourced by the scripts: installs what a fresh Debian machine lacks, so that the demo, the
# tests and the benchmarks need no hand steps. Packages already installed are left alone.

# need_root WHAT: the kernel and runtime work (netns, links, containerd) needs root.
need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "$1 needs root: it creates network namespaces and links (run it with sudo)" >&2
    exit 1
  fi
}

# need_packages PKG...: apt-get installs the missing ones.
need_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Each checked here too: called where errexit is off (timed, an if), a failure must still show.
  apt-get update -q -o DPkg::Lock::Timeout=600 >/dev/null || return
  apt-get install -y -q -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null || return
}

# need_cargo: the Rust toolchain cannot be fetched by a script here; say so plainly.
need_cargo() {
  [ -d "$HOME/.cargo/bin" ] && PATH="$HOME/.cargo/bin:$PATH"
  if ! command -v cargo >/dev/null; then
    echo "cargo is not installed: install a Rust toolchain >= 1.93 (rustup) and rerun" >&2
    exit 1
  fi
  # Cargo.toml's rust-version: an older toolchain fails far into the build otherwise.
  local have
  have=$(rustc --version 2>/dev/null | awk '{print $2}')
  if [ -n "$have" ] && [ "$(printf '%s\n%s\n' 1.93 "$have" | sort -V | head -n 1)" != 1.93 ]; then
    echo "rustc $have is older than the 1.93 this crate needs: update it (rustup update) and rerun" >&2
    exit 1
  fi
  # rustc links through the system's cc, proc macros and build scripts included.
  if [ "$(id -u)" = 0 ]; then
    need_packages gcc libc6-dev
  elif ! command -v cc >/dev/null; then
    echo "rustc needs a C linker (cc): install Debian's gcc and libc6-dev and rerun" >&2
    exit 1
  fi
}

# timed PART CMD...: runs CMD and says how long it took, as "time: PART: N s" on stderr (the
# cold-run budget in README is read from these lines).
timed() {
  local part=$1 started=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "time: $part: $((SECONDS - started)) s" >&2
  return "$status"
}

# help_if_asked SCRIPT LAST ARG: when ARG is -h or --help, prints SCRIPT's header comment
# (lines 2 to LAST) and exits.
help_if_asked() {
  case ${3:-} in
    -h | --help)
      sed -n "2,$2s/^# \{0,1\}//p" "$1"
      exit 0
      ;;
  esac
}
