# Sourced by the demo and the benchmark: builds the release binary and prints its path.

# build_plugin REPO: builds as the user who ran sudo when they own the checkout (a root-owned
# target/ would trouble their next build), else as ourselves. Prints the executable cargo
# reports: .cargo/config.toml names a build target, which moves it out of target/release.
build_plugin() {
  local repo=$1 home cargo_bin='' messages
  local -a build=(cargo build --release --manifest-path "$repo/Cargo.toml" --message-format=json-render-diagnostics)
  if [[ -n ${SUDO_USER:-} && $SUDO_USER != root && $(stat -c %U "$repo") == "$SUDO_USER" ]]; then
    home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
    # A login shell picks up rustup's PATH from the user's profile.
    cargo_bin=$(runuser -u "$SUDO_USER" -- env HOME="$home" bash -lc 'command -v cargo' 2>/dev/null) || cargo_bin=''
    [[ -z $cargo_bin && -x $home/.cargo/bin/cargo ]] && cargo_bin=$home/.cargo/bin/cargo
  fi
  if [[ -n $cargo_bin ]]; then
    messages=$(cd "$repo" && runuser -u "$SUDO_USER" -- env HOME="$home" PATH="$(dirname "$cargo_bin"):$PATH" "${build[@]}") || return 1
  else
    need_cargo
    messages=$(cd "$repo" && "${build[@]}") || return 1
  fi
  sed -n 's/.*"executable":"\([^"]*\/sandbox-guard\)".*/\1/p' <<<"$messages" | tail -n 1
}
