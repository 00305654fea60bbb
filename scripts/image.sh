#!/usr/bin/env bash
# Builds the node image: FROM scratch, the two static binaries alone, the plugin at
# /sandbox-guard (its entrypoint: the installer's flags go in the DaemonSet's args, and it
# hands them to /sandbox-guard-ctl beside it, which --install copies onto the node with it), offline with Debian's podman,
# and saves it as an OCI archive to load onto nodes or into a registry. Prints the archive's
# path; with --push, then the image's reference pinned by digest.
#
#   bash scripts/image.sh [x86_64|arm64] [TAG] [--push]
#        (default: this machine's arch, registry.example.com/sandbox-guard:<crate version>,
#         the name the DaemonSets use)
#
# Publish: TAG names your registry (`podman login` to it first); --push pushes it there and
# prints REPOSITORY@sha256:..., the reference to put in the DaemonSets (docs/install.md, "On a
# cluster"). SANDBOX_GUARD_TLS_VERIFY=false pushes to a registry without TLS (a test's).
# Or load it offline: `ctr -n k8s.io images import <archive>` on each node.
# SANDBOX_GUARD_BIN=<path> puts that (static) plugin, and the sandbox-guard-ctl beside it,
# in instead of building them: the tests build the image around the binaries they test.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/lib/packages.sh"
. "$repo/scripts/lib/build.sh"

help_if_asked "${BASH_SOURCE[0]}" 17 "${1:-}"
push=0
positional=()
for arg in "$@"; do
  case $arg in
    --push) push=1 ;;
    *) positional+=("$arg") ;;
  esac
done
set -- "${positional[@]}"
need_root "scripts/image.sh"
need_packages podman binutils
arch=$(plugin_arch "${1:-}") || exit 2
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
tag=${2:-registry.example.com/sandbox-guard:$version}
if [ -n "${SANDBOX_GUARD_BIN:-}" ]; then
  bin=$SANDBOX_GUARD_BIN
else
  bin=$(build_plugin "$repo" "$arch")
fi
ctl=$(dirname "$bin")/sandbox-guard-ctl
# FROM scratch has no loader and no libc.
for binary in "$bin" "$ctl"; do
  if ! is_static "$binary"; then
    echo "$binary is missing or not statically linked: a scratch image cannot run it (build both with scripts/build.sh)" >&2
    exit 1
  fi
done

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$bin" "$context/sandbox-guard"
cp "$ctl" "$context/sandbox-guard-ctl"
# Nothing but the binaries: they are static, and the installer needs no shell or libc.
cat >"$context/Containerfile" <<'CONTAINERFILE'
FROM scratch
COPY sandbox-guard sandbox-guard-ctl /
ENTRYPOINT ["/sandbox-guard"]
CONTAINERFILE
platform=linux/amd64
[ "$arch" = arm64 ] && platform=linux/arm64
podman build --quiet --pull=never --platform "$platform" --tag "$tag" "$context" >/dev/null
archive="${SANDBOX_GUARD_IMAGE_ARCHIVE:-$repo/target/sandbox-guard-image-$arch.tar}"
rm -f "$archive"
podman save --quiet --format oci-archive --output "$archive" "$tag"
echo "$archive"
if [ "$push" = 1 ]; then
  # A digest names these bytes for ever; a tag can be moved to others. The repository is the
  # tag without its `:tag` (a registry's `:port` comes before the last `/`).
  repository=$tag
  [[ ${tag##*/} == *:* ]] && repository=${tag%:*}
  podman push --quiet --digestfile "$context/digest" --tls-verify="${SANDBOX_GUARD_TLS_VERIFY:-true}" "$tag"
  echo "$repository@$(cat "$context/digest")"
fi
