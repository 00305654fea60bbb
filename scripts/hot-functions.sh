#!/usr/bin/env bash
# Writes scripts/lib/hot-functions.txt: the functions the CNI verbs run, which the x86_64
# release link lays out together (scripts/lib/link-ordered.sh). Run it again when the verbs'
# code paths or the dependencies change; the benchmark's peak RSS says when it is due.
#
#   sudo bash scripts/hot-functions.sh
#
# Builds the static release binary with its symbols, runs each verb once under valgrind's
# callgrind, which names every function run, and keeps those names: chained ADD, CHECK and DEL
# on a veth in a network namespace of its own, then ADD, CHECK and DEL wrapping Debian's bridge
# and host-local (delegate mode), STATUS, GC and VERSION. Added to them: the AVX and EVEX string
# functions glibc picks on a node's CPU (valgrind's CPU gets the SSE ones) and sha2's SHA-NI code.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/lib/packages.sh"
. "$repo/scripts/lib/build.sh"
help_if_asked "${BASH_SOURCE[0]}" 12 "${1:-}"
need_root "scripts/hot-functions.sh"
[[ $(plugin_arch) == x86_64 ]] || { echo "the ordered link is x86_64's: run this on x86_64" >&2; exit 1; }
need_packages valgrind iproute2 binutils containernetworking-plugins

export CARGO_TARGET_DIR=$repo/target/hot-functions CARGO_PROFILE_RELEASE_STRIP=false
bin=$(build_plugin "$repo")
list=$repo/scripts/lib/hot-functions.txt
work=$(mktemp -d)
netns=sghot-$$
cleanup() {
  ip netns del "$netns" 2>/dev/null || true
  ip link del "sghot$$" 2>/dev/null || true
  ip link del "sghbr$$" 2>/dev/null || true
  rm -rf "$work" "$list.new"
}
trap cleanup EXIT
ip netns add "$netns"
ip link add "sghot$$" type veth peer name eth0 netns "$netns"
ip -n "$netns" link set eth0 up

runs=0
verb() { # VERB IFNAME CONTAINER CONFIG
  CNI_COMMAND=$1 CNI_IFNAME=$2 CNI_CONTAINERID=$3 CNI_NETNS=/run/netns/$netns CNI_PATH=/usr/lib/cni \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=hot;K8S_POD_NAME=pod-0;K8S_POD_INFRA_CONTAINER_ID=$3;K8S_POD_UID=00000000-0000-4000-8000-000000000001" \
    valgrind --tool=callgrind -q --show-below-main=yes --callgrind-out-file="$work/callgrind.$((++runs))" "$bin" <<<"$4" >"$work/out" ||
    { echo "$1 failed under callgrind: $(cat "$work/out")" >&2; exit 1; }
}
state=$work/state
chained_id=$(printf '%064x' 1) delegate_id=$(printf '%064x' 2)
prev='{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"0a:58:0a:00:00:02","sandbox":"/run/netns/'$netns'"}],"ips":[{"address":"10.0.0.2/8","gateway":"10.0.0.1","interface":0}],"routes":[{"dst":"0.0.0.0/0","gw":"10.0.0.1"}],"dns":{}}'
chained='{"cniVersion":"1.0.0","name":"hotnet","type":"sandbox-guard","stateDir":"'$state'","prevResult":'$prev'}'
for command in ADD CHECK DEL; do verb "$command" eth0 "$chained_id" "$chained"; done
delegated='{"cniVersion":"1.0.0","name":"hotnet","type":"sandbox-guard","stateDir":"'$state'","delegate":{"type":"bridge","bridge":"sghbr'$$'","ipam":{"type":"host-local","dataDir":"'$work/ipam'","ranges":[[{"subnet":"100.64.0.0/16"}]]}}}'
verb ADD eth1 "$delegate_id" "$delegated"
verb CHECK eth1 "$delegate_id" "${delegated%\}},\"prevResult\":$(cat "$work/out")}"
verb DEL eth1 "$delegate_id" "$delegated"
plain='{"cniVersion":"1.1.0","name":"hotnet","type":"sandbox-guard","stateDir":"'$state'"}'
verb STATUS eth0 "$chained_id" "$plain"
verb GC eth0 "$chained_id" '{"cniVersion":"1.1.0","name":"hotnet","type":"sandbox-guard","stateDir":"'$state'","cni.dev/valid-attachments":[]}'
verb VERSION eth0 "$chained_id" '{"cniVersion":"1.1.0"}'

{
  echo "# The functions the CNI verbs run, demangled, for the release link's layout"
  echo "# (scripts/lib/link-ordered.sh). Made by scripts/hot-functions.sh; do not edit by hand."
  {
    sed -n "s/^c\{0,1\}fn=([0-9]*) //p" "$work"/callgrind.* | sed "s/'[0-9]*$//" |
      grep -v -e '^0x' -e '^(below main)$'
    nm --defined-only --format=just-symbols --demangle "$bin" |
      grep -E -e '^__(mem|str|stp|rawmem|wmem|wcs)[a-z0-9]*_(avx|evex)' -e '^sha2::sha256::x86::'
  } | LC_ALL=C sort -u
} >"$list.new"
# Owned as the checkout's scripts are, not by root.
chown --reference="$repo/scripts/lib" "$list.new"
mv "$list.new" "$list"
echo "$(grep -vc '^#' "$list") functions in $list ($runs verbs run)"
