# Sourced by scripts/build.sh, the demo, the benchmark and the tests: builds the release
# binary, statically linked, for this machine's arch or the other one, and prints its path.
#
# The static link is asked for by .cargo/static.toml, per target triple, and every build here
# names its target: only then does cargo keep those rustflags away from the proc macros it
# builds for the host (a static proc macro cannot be loaded). See that file.

# plugin_arch [ARCH]: x86_64 or arm64, from a name uname or Debian uses (default: this
# machine's arch).
plugin_arch() {
  local arch=${1:-$(uname -m)}
  case $arch in
    x86_64 | amd64) echo x86_64 ;;
    arm64 | aarch64) echo arm64 ;;
    *)
      echo "no static build for arch '$arch': x86_64 or arm64" >&2
      return 1
      ;;
  esac
}

# plugin_triple ARCH: the Rust target triple of x86_64 or arm64. musl, not glibc: a static
# glibc program probes the CPU before `main` with CPUID instructions, each a trap to the
# hypervisor on a virtual machine, on every exec of the plugin (docs/benchmarks.md).
plugin_triple() {
  case $1 in
    x86_64) echo x86_64-unknown-linux-musl ;;
    arm64) echo aarch64-unknown-linux-musl ;;
  esac
}

# qemu_user ARCH: the qemu-user binary (Debian's qemu-user) that runs ARCH's executables.
qemu_user() {
  case $1 in
    x86_64) echo qemu-x86_64 ;;
    arm64) echo qemu-aarch64 ;;
  esac
}

# need_musl_toolchain: what a build for this machine's own musl triple needs beyond rustup's
# standard library for it: a C compiler for musl (Debian's musl-tools), for ring's C code in the
# operator's HTTPS client. Installs it as root; a user without it is told what to run.
need_musl_toolchain() {
  if [[ $(id -u) == 0 ]]; then
    need_packages musl-tools || return 1
  elif ! command -v musl-gcc >/dev/null; then
    echo "a static build needs Debian's musl-tools: run it once as root (sudo bash scripts/build.sh)" \
      "or install it" >&2
    return 1
  fi
}

# need_host_musl_build: all a build for this machine's own musl triple needs, for whoever runs
# cargo here as themselves (the tests, CI's clippy): musl-tools and rustup's standard library.
need_host_musl_build() {
  need_musl_toolchain && need_rust_target "$(plugin_triple "$(plugin_arch)")"
}

# need_cross_toolchain ARCH: Debian's cross gcc for ARCH (printed). It links the musl build
# against the musl that rustup ships for the target, and compiles ring's C code, which takes
# only memcpy and memset from a libc. Installs it as root; a user without it is told what to
# run.
need_cross_toolchain() {
  local arch=$1 linker
  local -a packages
  case $arch in
    x86_64) linker=x86_64-linux-gnu-gcc packages=(gcc-x86-64-linux-gnu libc6-dev-amd64-cross) ;;
    arm64) linker=aarch64-linux-gnu-gcc packages=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross) ;;
  esac
  if [[ $(id -u) == 0 ]]; then
    need_packages "${packages[@]}" || return 1
  elif ! command -v "$linker" >/dev/null; then
    echo "a static $arch build from this machine needs Debian's ${packages[*]}:" \
      "run it once as root (sudo bash scripts/build.sh $arch) or install them" >&2
    return 1
  fi
  echo "$linker"
}

# is_static BINARY: no program interpreter and no shared library needed (a static-pie has a
# dynamic section, for its own relocations, but needs nothing).
is_static() {
  local headers
  if ! command -v readelf >/dev/null; then
    echo "readelf (binutils) is missing: cannot tell whether $1 is static" >&2
    return 1
  fi
  headers=$(readelf -lW "$1" && readelf -dW "$1") || return 1
  ! grep -q -e 'program interpreter' -e '(NEEDED)' <<<"$headers"
}

# build_plugin REPO [ARCH]: builds for ARCH (default: this machine's) and prints the path of
# the static plugin, as cargo reports it, with sandbox-guard-ctl beside it (named targets build under target/<triple>/).
# PLUGIN_PROFILE names another cargo profile than release (the demo's: Cargo.toml).
# Builds as the user who ran sudo when they own the checkout (a root-owned target/ would
# trouble their next build), else as ourselves. For another arch it first installs Debian's
# cross gcc (as root) and rustup's standard library for the target (as the builder).
build_plugin() {
  local checkout arch host triple linker messages bin
  checkout=$(cd "$1" && pwd) || return 1
  arch=$(plugin_arch "${2:-}") || return 1
  host=$(plugin_arch) || return 1
  triple=$(plugin_triple "$arch")
  local -a build=(cargo build --profile "${PLUGIN_PROFILE:-release}" --manifest-path "$checkout/Cargo.toml"
    --config "$checkout/.cargo/static.toml" --target "$triple" --message-format=json-render-diagnostics)
  if [[ $arch != "$host" ]]; then
    linker=$(need_cross_toolchain "$arch") || return 1
    build=(env "CC_${triple//-/_}=$linker" "${build[@]}" --config "target.$triple.linker=\"$linker\"")
  else
    need_musl_toolchain || return 1
  fi
  local -a as_builder=()
  choose_builder "$checkout" || return 1
  (cd "$checkout" && need_rust_target "$triple" "${as_builder[@]}") || return 1
  messages=$(cd "$checkout" && "${as_builder[@]}" "${build[@]}") || return 1
  bin=$(sed -n 's/.*"executable":"\([^"]*\/sandbox-guard\)".*/\1/p' <<<"$messages" | tail -n 1)
  if [[ -z $bin ]]; then
    echo "cargo reported no sandbox-guard executable for $triple" >&2
    return 1
  fi
  # The operator's binary, which the plugin execs from beside itself, is built with it (a
  # checkout from before it was split off, a bench's baseline, has none).
  local -a binaries=("$bin")
  grep -q '"executable":"[^"]*/sandbox-guard-ctl"' <<<"$messages" && binaries+=("$(dirname "$bin")/sandbox-guard-ctl")
  for binary in "${binaries[@]}"; do
    if ! is_static "$binary"; then
      echo "$binary is missing or not statically linked: does RUSTFLAGS in the environment" \
        "override .cargo/static.toml's rustflags?" >&2
      return 1
    fi
  done
  echo "$bin"
}

# choose_builder CHECKOUT: sets the caller's `as_builder` to what cargo runs under: the user
# who ran sudo, with their rustup's PATH, when they own the checkout (a root-owned target/
# would trouble their next build); else nothing, with cargo made available here.
choose_builder() {
  local home cargo_bin=''
  as_builder=()
  if [[ -n ${SUDO_USER:-} && $SUDO_USER != root && $(stat -c %U "$1") == "$SUDO_USER" ]]; then
    home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
    # A login shell picks up rustup's PATH from the user's profile.
    cargo_bin=$(runuser -u "$SUDO_USER" -- env HOME="$home" bash -lc 'command -v cargo' 2>/dev/null) || cargo_bin=''
    [[ -z $cargo_bin && -x $home/.cargo/bin/cargo ]] && cargo_bin=$home/.cargo/bin/cargo
  fi
  if [[ -n $cargo_bin ]]; then
    as_builder=(runuser -u "$SUDO_USER" -- env HOME="$home" PATH="$(dirname "$cargo_bin"):$PATH")
  else
    need_cargo
  fi
}

# need_rust_target TRIPLE [RUNNER...]: the Rust standard library for TRIPLE, added with rustup
# (run through RUNNER, the builder's user) when the toolchain lacks it.
need_rust_target() {
  local triple=$1 sysroot
  shift
  sysroot=$("$@" rustc --print sysroot) || return 1
  [[ -d $sysroot/lib/rustlib/$triple/lib ]] && return 0
  if ! "$@" bash -c 'command -v rustup' >/dev/null; then
    echo "the Rust toolchain at $sysroot has no standard library for $triple, and no rustup" \
      "to add it: install one that has" >&2
    return 1
  fi
  echo "adding the Rust standard library for $triple (rustup target add)" >&2
  "$@" rustup target add "$triple" >&2
}
