#!/usr/bin/env bash
# Replays the stale-DEL incident (seed 001: pod lijiaob/etcd1-0, a StatefulSet pod whose name
# survives re-creation) through the real libcni, with the reference bridge + host-local plugins
# and sandbox-guard last in the chain, in throwaway namespaces. Everything it creates is
# removed on exit, also when interrupted.
#
#   sudo bash scripts/demo.sh
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ -t 1 ]]; then
	bold=$'\e[1m' dim=$'\e[2m' red=$'\e[31m' green=$'\e[32m' reset=$'\e[0m'
else
	bold='' dim='' red='' green='' reset=''
fi
step() { printf '\n%s==> %s%s\n' "$bold" "$*" "$reset"; }
say() { printf '    %s\n' "$@"; }
good() { printf "    $green%s$reset\n" "$@"; }
die() {
	printf '%sdemo failed: %s%s\n' "$red" "$*" "$reset" >&2
	exit 1
}

. "$repo/scripts/lib/packages.sh"
. "$repo/scripts/lib/build.sh"
need_root "scripts/demo.sh"

# --- what the demo needs ------------------------------------------------------------------
build_guard() {
	guard_bin=$(build_plugin "$repo") || die "cargo build failed"
	[[ -x $guard_bin ]] || die "cargo built no sandbox-guard binary"
}

# --- throwaway world, removed on any exit -------------------------------------------------
run_id=$(printf '%04x%02x' $RANDOM $((RANDOM % 256)))
network=sgdemo-$run_id
bridge=sgd$run_id
ns_a=sgdemo-$run_id-a
ns_b=sgdemo-$run_id-b
work=''

cleanup() {
	local status=$?
	trap - EXIT INT TERM
	ip netns delete "$ns_a" 2>/dev/null || true
	ip netns delete "$ns_b" 2>/dev/null || true
	ip link delete "$bridge" 2>/dev/null || true
	[[ -n $work ]] && rm -rf "$work"
	((status == 0)) || printf '%s(cleaned up after failure or interrupt)%s\n' "$dim" "$reset" >&2
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A /24 no route or address on this host already uses, so the demo never shadows a real network.
free_subnet() {
	local used candidate
	used="$(ip -4 route show table all) $(ip -4 -o addr)"
	for _ in $(seq 200); do
		candidate="10.$((200 + RANDOM % 55)).$((RANDOM % 256))"
		[[ $used == *"$candidate."* ]] || { echo "$candidate"; return; }
	done
	die "no free 10.200-254.x.0/24 subnet"
}

need_packages golang-go golang-github-appc-cni-dev containernetworking-plugins iproute2 iputils-ping
step "Building sandbox-guard (cargo build --release) and a libcni driver"
build_guard
work=$(mktemp -d /tmp/sandbox-guard-demo.XXXXXX)
bash "$repo/scripts/build-libcni-driver.sh" "$work/driver" >/dev/null
driver=$work/driver/libcni-driver
say "plugin: $guard_bin" \
	"driver: Debian's libcni $(dpkg-query -W -f='${Version}' golang-github-appc-cni-dev), the library containerd's CRI plugin calls"

mkdir -p "$work/bin" "$work/cache" "$work/state" "$work/ipam"
for plugin in bridge host-local; do ln -s "/usr/lib/cni/$plugin" "$work/bin/$plugin"; done
ln -s "$guard_bin" "$work/bin/sandbox-guard"
net_prefix=$(free_subnet)
conflist=$work/$network.conflist
cat >"$conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$network",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$work/ipam",
        "ranges": [[{ "subnet": "$net_prefix.0/24" }]]
      }
    },
    {
      "type": "sandbox-guard",
      "stateDir": "$work/state",
      "staleDel": "refuse",
      "logFile": "$work/sandbox-guard.log"
    }
  ]
}
EOF
ip netns add "$ns_a"
ip netns add "$ns_b"

step "The node's CNI configuration: bridge + host-local, sandbox-guard LAST"
sed 's/^/    /' "$conflist"
say "Last on ADD means it sees the primary's result; last in the list also means FIRST on DEL," \
	"and libcni stops a DEL at the first plugin that fails: the guard's only lever, and enough."

container_id() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
sandbox_a=$(container_id)
sandbox_b=$(container_id)

# The narrative goes to fd 3 so that $(libcni add ...) captures only libcni's result.
exec 3>&1
# libcni VERB CONTAINER NETNS UID: the call containerd makes for kubelet, pod lijiaob/etcd1-0.
libcni() {
	local verb=$1 container=$2 netns=$3 uid=$4
	printf '    %s$ libcni %sNetworkList  container=%s…  netns=%s  K8S_POD_NAMESPACE=lijiaob K8S_POD_NAME=etcd1-0 K8S_POD_UID=%s%s\n' \
		"$dim" "${verb^}" "${container:0:12}" "$netns" "$uid" "$reset" >&3
	"$driver" -conflist "$conflist" -bin-dir "$work/bin" -cache-dir "$work/cache" \
		-container-id "$container" -netns "/var/run/netns/$netns" -ifname eth0 \
		-args "K8S_POD_NAMESPACE=lijiaob;K8S_POD_NAME=etcd1-0;K8S_POD_UID=$uid;K8S_POD_INFRA_CONTAINER_ID=$container" \
		"$verb"
}
ip_of() { grep -o '"address":"[^"/]*' <<<"$1" | head -1 | cut -d'"' -f4; }
dump() { "$guard_bin" --dump-checkpoints --state-dir "$work/state" --output table | sed 's/^/    /'; }
ipam_holder() { head -1 "$work/ipam/$network/$1" 2>/dev/null | tr -d '\r'; }

step "1. kubelet starts pod lijiaob/etcd1-0 (uid 1): containerd runs ADD for sandbox A"
result_a=$(libcni add "$sandbox_a" "$ns_a" 1)
ip_a=$(ip_of "$result_a")
say "libcni result: $result_a"
good "sandbox A ${sandbox_a:0:12} got $ip_a; the guard checkpointed it and made A the owner of lijiaob/etcd1-0/eth0"

step "2. The pod is re-created (same StatefulSet name, uid 2): ADD for sandbox B"
say "A's teardown has not completed (in the incident its DEL kept failing), so kubelet keeps retrying it."
result_b=$(libcni add "$sandbox_b" "$ns_b" 2)
ip_b=$(ip_of "$result_b")
good "sandbox B ${sandbox_b:0:12} got $ip_b; the guard moved ownership of lijiaob/etcd1-0/eth0 to B"

step "3. kubelet retries StopPodSandbox for the OLD sandbox A: DEL A"
say "With calico (the incident) this DEL releases IPAM handle 'lijiaob.etcd1-0' and deletes workload" \
	"endpoint lijiaob.etcd1-0/eth0, both named after the POD, not the sandbox: they are B's now."
if refusal=$(libcni del "$sandbox_a" "$ns_a" 1 2>&1); then
	die "the guard let the stale DEL of A through"
fi
printf '    %s%s%s\n' "$red" "${refusal//$'\n'/$'\n    '}" "$reset"
[[ $refusal == *"code 11"* && $refusal == *"stale DEL"* ]] || die "DEL A failed, but not with the guard's stale-DEL error (code 11)"
[[ $(ipam_holder "$ip_a") == "$sandbox_a" ]] || die "host-local released A's $ip_a: the DEL went past the guard"
[[ -f $work/cache/results/$network-$sandbox_a-eth0 ]] || die "libcni dropped A's cached result"
good "Refused (CNI code 11, try again later): B owns the pod key, so a DEL by A can only hurt B." \
	"libcni ran the guard first and stopped there: bridge and host-local never saw this DEL," \
	"and libcni kept A's cached result so the DEL can be retried later."

step "4. B is untouched: still reachable and its IP still allocated"
ip -n "$ns_b" -brief address show eth0 | sed 's/^/    /'
[[ $(ipam_holder "$ip_b") == "$sandbox_b" ]] || die "host-local no longer holds $ip_b for B"
say "host-local reservation $ip_b -> ${sandbox_b:0:12}… (B)"
ping -c 3 -i 0.3 -W 2 "$ip_b" | sed 's/^/    /' || die "B ($ip_b) is unreachable"
good "node -> B ($ip_b) over bridge $bridge: reachable"

step "5. What the guard has checkpointed (sandbox-guard --dump-checkpoints)"
dump

step "6. The pod is finally deleted: kubelet stops B, DEL B"
libcni del "$sandbox_b" "$ns_b" 2
good "B owned the pod key: the guard passed the DEL on, bridge and host-local released $ip_b"

step "7. kubelet's retry of DEL A comes again: now it passes"
libcni del "$sandbox_a" "$ns_a" 1
good "nobody else owns lijiaob/etcd1-0/eth0 any more: A's DEL is harmless, so the guard lets it through"
[[ -z $(ipam_holder "$ip_a") && -z $(ipam_holder "$ip_b") ]] || die "an address is still reserved"
say "host-local reservations left: none"

step "8. Final checkpoints (nothing left)"
dump
if [[ -s $work/sandbox-guard.log ]]; then
	step "The guard's log (logFile), one line per operation"
	sed 's/^/    /' "$work/sandbox-guard.log"
fi
printf '\n%sDemo complete; removing namespaces, bridge %s and %s.%s\n' "$bold" "$bridge" "$work" "$reset"
