#!/usr/bin/env bash
# Replays the stale-DEL incident (pod lijiaob/etcd1-0, a StatefulSet pod whose name survives
# re-creation) through the real libcni, three ways, each in fresh throwaway
# namespaces: without the guard, with sandbox-guard chained last, and with sandbox-guard
# wrapping the primary (delegate mode). The primary is tests/cri/calico-cni-v1-model-plugin, a model
# of calico-cni up to v1.6.2 (calico 2.1.3): its IP handle, endpoint and host veth are keyed by the POD NAME,
# so the old sandbox's late DEL tears down the new sandbox's network. Everything it creates
# is removed on exit, also when interrupted.
#
# Needs root, a Rust toolchain (cargo, Rust >= 1.93) and a kernel with network namespaces and
# veth links; checks them before it installs anything. It then installs the Debian packages
# it lacks (Go and Debian's libcni source, iproute2, iputils-ping) and builds the plugin with
# the demo profile (release code without LTO; Cargo.toml), which a first run compiles once.
#
#   sudo bash scripts/demo.sh
#   sudo bash scripts/demo.sh --real-node   # the same incident on a real node: kubelet, the API
#                                           # server, the StatefulSet controller (scripts/node.sh),
#                                           # without the guard, then with its DaemonSet; needs Go
#                                           # and the Go module proxy, minutes for the first build
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ -t 1 ]]; then
	bold=$'\e[1m' dim=$'\e[2m' red=$'\e[31m' green=$'\e[32m' reset=$'\e[0m'
else
	bold='' dim='' red='' green='' reset=''
fi
act() { printf '\n%s######## %s%s\n' "$bold" "$*" "$reset"; }
step() { printf '\n%s==> %s%s\n' "$bold" "$*" "$reset"; }
say() { printf '    %s\n' "$@"; }
good() { printf "    $green%s$reset\n" "$@"; }
bad() { printf "    $red%s$reset\n" "$@"; }
indent() { sed 's/^/    /'; }
die() {
	printf '%sdemo failed: %s%s\n' "$red" "$*" "$reset" >&2
	exit 1
}

. "$repo/scripts/lib/packages.sh"
. "$repo/scripts/lib/build.sh"

real_node=0
case ${1:-} in
	'') ;;
	--real-node) real_node=1 ;;
	*) die "usage: scripts/demo.sh [--real-node]" ;;
esac

# --- what the demo needs, checked before anything is installed ----------------------------
need_root "scripts/demo.sh"
# Cargo as build_plugin finds it: the sudo user's own toolchain when there is one, else ours.
sudo_home=''
[[ -n ${SUDO_USER:-} && $SUDO_USER != root ]] && sudo_home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
if [[ -z $sudo_home ]] || ! { [[ -x $sudo_home/.cargo/bin/cargo ]] ||
	runuser -u "$SUDO_USER" -- env HOME="$sudo_home" bash -lc 'command -v cargo' >/dev/null 2>&1; }; then
	need_cargo
fi
# The kernel: network namespaces (unshare is util-linux, on every Debian) and veth links,
# tried in a namespace of their own that vanishes with them. Without iproute2 yet, the veth
# check waits until the packages are in.
if command -v unshare >/dev/null && ! unshare --net true 2>/dev/null; then
	die "this kernel (or container) cannot make a network namespace: the demo needs CONFIG_NET_NS and CAP_SYS_ADMIN"
fi
check_veth() {
	unshare --net ip link add sgdemo0 type veth peer name sgdemo1 2>/dev/null ||
		die "this kernel cannot make a veth pair (CONFIG_VETH): the demo's pods are attached by veth pairs"
}
command -v ip >/dev/null && command -v unshare >/dev/null && check_veth

build_guard() {
	local started=$SECONDS
	# tests/demo.rs hands over the plugin under test, its ctl beside it: CI plays the demo
	# without building the crate a second time.
	if [[ -n ${DEMO_PLUGIN:-} ]]; then
		guard_bin=$DEMO_PLUGIN
		[[ -x $guard_bin && -x $(dirname "$guard_bin")/sandbox-guard-ctl ]] ||
			die "DEMO_PLUGIN=$guard_bin is not an executable with sandbox-guard-ctl beside it"
		say "given: $guard_bin"
		return
	fi
	# The first build compiles every crate (a few minutes on a small machine); cargo's
	# progress goes to the terminal.
	guard_bin=$(PLUGIN_PROFILE=demo build_plugin "$repo") || die "cargo build of the plugin failed (its messages are above)"
	[[ -x $guard_bin ]] || die "cargo built no sandbox-guard binary"
	say "built in $((SECONDS - started)) s: $guard_bin"
}

# --- throwaway world, removed on any exit -------------------------------------------------
run_id=$(printf '%04x%02x' $RANDOM $((RANDOM % 256)))
network=sgdemo-$run_id
# The primary names host veths <prefix><hash of the pod name>: a prefix of this run's own
# finds every link the demo made and nothing else.
veth_prefix=sgd$run_id
namespaces=()
unreachable=''
work=''

cleanup() {
	local status=$? ns link
	trap - EXIT INT TERM
	for ns in "${namespaces[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
	for link in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep "^$veth_prefix"); do
		ip link delete "$link" 2>/dev/null || true
	done
	[[ -n $unreachable ]] && ip route delete unreachable "$unreachable" 2>/dev/null
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

need_packages golang-go golang-github-appc-cni-dev iproute2 iputils-ping util-linux
check_veth
step "Building sandbox-guard (cargo build --profile demo; the first build compiles every crate) and a libcni driver"
build_guard
work=$(mktemp -d /tmp/sandbox-guard-demo.XXXXXX)
bash "$repo/scripts/build-libcni-driver.sh" "$work/driver" >/dev/null
driver=$work/driver/libcni-driver
mkdir -p "$work/bin"
ln -s "$repo/tests/cri/calico-cni-v1-model-plugin" "$work/bin/calico-cni-v1-model"
ln -s "$guard_bin" "$work/bin/sandbox-guard"
net_prefix=$(free_subnet)
# The pods' /32 routes are more specific; an address whose route the primary took away fails
# at once instead of leaving the host by its default route.
ip route add unreachable "$net_prefix.0/24"
unreachable=$net_prefix.0/24
say "plugin: $guard_bin" \
	"driver: Debian's libcni $(dpkg-query -W -f='${Version}' golang-github-appc-cni-dev), the library containerd's CRI plugin calls" \
	"primary: calico-cni-v1-model, a model of calico-cni up to v1.6.2 (calico 2.1.3): IP handle, workload endpoint and host" \
	"         veth all keyed by \"lijiaob.etcd1-0\" (namespace.podname), never by the sandbox"

# --- one act: fresh namespaces, a fresh primary and guard state, its own conflist ---------
container_id() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

new_act() { # name: sets act_dir, conflist, ns_a, ns_b, sandbox_a, sandbox_b
	act_dir=$work/$1
	conflist=$act_dir/$network.conflist
	ns_a=sgdemo-$run_id-$1-a
	ns_b=sgdemo-$run_id-$1-b
	sandbox_a=$(container_id)
	sandbox_b=$(container_id)
	mkdir -p "$act_dir/cache" "$act_dir/guard"
	namespaces+=("$ns_a" "$ns_b")
	ip netns add "$ns_a"
	ip netns add "$ns_b"
}
end_act() { ip netns delete "$ns_a"; ip netns delete "$ns_b"; }

# The primary's conflist entry; "onMissingEndpoint": "ignore" is calico 1.10's answer to
# containerd's second DEL of a sandbox.
primary_entry() {
	printf '{ "type": "calico-cni-v1-model", "stateDir": "%s", "subnet": "%s", "hostVethPrefix": "%s", "onMissingEndpoint": "ignore" }' \
		"$act_dir/primary" "$net_prefix.0/24" "$veth_prefix"
}
guard_keys() { printf '"stateDir": "%s", "logFile": "%s"' "$act_dir/guard" "$act_dir/guard.log"; }
write_conflist() { # plugin entry...
	local entries
	printf -v entries ',\n  %s' "$@"
	printf '{ "cniVersion": "1.0.0", "name": "%s", "plugins": [\n%s\n] }\n' "$network" "${entries:2}" >"$conflist"
	indent <"$conflist"
}

# The narrative goes to fd 3 so that $(libcni add ...) captures only libcni's result.
exec 3>&1
# libcni VERB CONTAINER NETNS UID: the call containerd makes for kubelet, pod lijiaob/etcd1-0.
# An empty NETNS is containerd's second DEL, from RemovePodSandbox.
libcni() {
	local verb=$1 container=$2 netns=$3 uid=$4
	printf '    %s$ libcni %sNetworkList  container=%s  netns=%s  K8S_POD_NAMESPACE=lijiaob K8S_POD_NAME=etcd1-0 K8S_POD_UID=%s%s\n' \
		"$dim" "${verb^}" "${container:0:13}" "$netns" "$uid" "$reset" >&3
	"$driver" -conflist "$conflist" -bin-dir "$work/bin" -cache-dir "$act_dir/cache" \
		-container-id "$container" -netns "${netns:+/var/run/netns/$netns}" -ifname eth0 \
		-args "K8S_POD_NAMESPACE=lijiaob;K8S_POD_NAME=etcd1-0;K8S_POD_UID=$uid;K8S_POD_INFRA_CONTAINER_ID=$container" \
		"$verb"
}
ip_of() { grep -o '"address":"[^"/]*' <<<"$1" | head -1 | cut -d'"' -f4; }
# Who the primary thinks holds an address ("" when released).
ipam_holder() { cat "$act_dir/primary/ips/$1" 2>/dev/null || true; }
# Container IDs cut to their first 13 characters, as crictl shows them.
short_ids() { sed 's/\([0-9a-f]\{13\}\)[0-9a-f]\{19,\}/\1/g'; }
# The DELs the primary got, from its own trace, and whose endpoint each removed.
primary_dels() {
	grep ' DEL ' "$act_dir/primary/calls.log" |
		sed -E -e 's/^[^ ]+ (DEL [^ ]+) [^ ]+ (netns=.*)/\1 \2/' -e 's/netns=$/netns= (empty)/' \
			-e "s/$sandbox_a/A/g; s/$sandbox_b/B/g" | indent
}
# Addresses and endpoints the primary still holds, one a line.
primary_holds() { find "$act_dir/primary/ips" "$act_dir/primary/endpoints" -type f -printf '%f\n'; }
has_eth0() { ip -n "$1" link show eth0 >/dev/null 2>&1; }
reachable() { ping -c 2 -i 0.3 -W 1 "$1" >/dev/null 2>&1; }
# The guard's log lines without their time and pid, container IDs shortened.
short_log() { sed 's/^[^ ]* sandbox-guard\[[0-9]*\] //' | short_ids | indent; }
dump() { "$guard_bin" --dump-checkpoints --state-dir "$act_dir/guard" --output table | indent; }

# ADD A, then ADD B for the re-created pod; sets ip_a, ip_b. The narration is the same in
# every act: only what guards the primary differs.
start_both() {
	step "kubelet starts lijiaob/etcd1-0 (uid 1): ADD for sandbox A"
	ip_a=$(ip_of "$(libcni add "$sandbox_a" "$ns_a" 1)")
	good "sandbox A ${sandbox_a:0:13} got $ip_a"
	step "The pod is re-created under the same name (uid 2) before A's teardown succeeded: ADD for sandbox B"
	ip_b=$(ip_of "$(libcni add "$sandbox_b" "$ns_b" 2)")
	good "sandbox B ${sandbox_b:0:13} got $ip_b; the handle lijiaob.etcd1-0 now points at B"
	reachable "$ip_b" || die "B ($ip_b) is unreachable right after its ADD"
	has_eth0 "$ns_a" && die "A still has eth0: the primary no longer replaces the host veth named after the pod"
	say "(A's eth0 is already gone: the primary's ADD of B deleted the host veth named after the pod," \
		" as calico's \"clean up if hostVeth exists\" did, and the pod end went with it)"
}
del_a_banner() {
	step "kubelet retries StopPodSandbox for the OLD sandbox A: DEL A"
}

if ((real_node)); then
	. "$repo/scripts/lib/demo-node.sh"
	demo_real_node
	exit 0
fi

declare -A outcome=()

# --- act 1: no guard -----------------------------------------------------------------------
act "Act 1 of 3: the primary alone, as on the node of the incident"
new_act unguarded
write_conflist "$(primary_entry)"
start_both
del_a_banner
libcni del "$sandbox_a" "$ns_a" 1 || die "DEL A failed without the guard"
say "libcni: DEL A succeeded. The primary's own trace of it:"
primary_dels
reachable "$ip_b" && die "B ($ip_b) is still reachable: the model primary did not reproduce the incident"
# calico's DEL deletes the workload endpoint the handle points to, and felix its route; the host
# veth stays (the model's header, tests/cri/calico-cni-v1-model-plugin).
[[ -z $(ip route show "$ip_b/32") ]] || die "the node still routes $ip_b after DEL A"
[[ -z $(ipam_holder "$ip_b") ]] || die "the primary still holds $ip_b after DEL A"
bad "B is cut off: its endpoint and its host route are gone, $ip_b is free for the next pod," \
	"ping from the node to B ($ip_b) fails. B is running, with no network, and nobody was told."
say "B's netns now (its eth0 stays; nothing routes to it):"
ip -n "$ns_b" -brief link | indent
outcome[unguarded]="DEL A succeeded and cut B off: B's endpoint and route deleted, $ip_b released"
say "This act showed: ${outcome[unguarded]}."
end_act

# --- act 2: chained last -------------------------------------------------------------------
act "Act 2 of 3: sandbox-guard chained LAST after the primary (chained mode)"
new_act chained
write_conflist "$(primary_entry)" "{ \"type\": \"sandbox-guard\", $(guard_keys), \"staleDel\": \"refuse\" }"
say "Last on ADD it sees the primary's result; last in the list it runs FIRST on DEL, and libcni" \
	"stops a DEL at the first plugin that fails: the guard's only lever."
start_both
del_a_banner
if refusal=$(libcni del "$sandbox_a" "$ns_a" 1 2>&1); then
	die "the guard let the stale DEL of A through"
fi
grep -v '^details:' <<<"$refusal" | short_ids | while IFS= read -r line; do bad "$line"; done
way_out=$(sed -n 's/.*"wayOut":"\(\([^"\\]\|\\.\)*\)".*/\1/p' <<<"$refusal" | head -n 1 | sed 's/\\"/"/g')
say "The error's details (JSON) name the owner's pod UID and generation, and the way out:" \
	"  $way_out"
[[ $refusal == *"code 11"* && $refusal == *"stale DEL"* ]] || die "DEL A failed, but not with the guard's stale-DEL error (code 11)"
grep -q " DEL $sandbox_a " "$act_dir/primary/calls.log" && die "the primary saw DEL A"
reachable "$ip_b" || die "B ($ip_b) is unreachable after the refused DEL"
[[ $(ipam_holder "$ip_b") == lijiaob.etcd1-0 ]] || die "the primary no longer holds $ip_b for the pod"
good "Refused (code 11, try again later): the primary never saw DEL A. B is reachable, $ip_b still B's."
say "The price: containerd's StopPodSandbox of A fails, and kubelet retries it every minute for as" \
	"long as B lives; A's sandbox stays NOTREADY and its netns stays pinned. The guard's dump:"
dump
step "The way out, run: the pod is deleted (DEL B), then kubelet's next retry of DEL A"
libcni del "$sandbox_b" "$ns_b" 2 || die "DEL B failed"
libcni del "$sandbox_a" "$ns_a" 1 || die "the retried DEL A failed once B was gone"
good "B owned the pod name, so DEL B passed; then nobody owned it, so DEL A passed too."
[[ -z $(primary_holds) ]] || die "the primary still holds an address or endpoint"
outcome[chained]="DEL A refused (code 11), B kept its network; A's stop failed until B was gone"
say "This act showed: ${outcome[chained]}."
end_act

# --- act 3: delegate mode -----------------------------------------------------------------
act "Act 3 of 3: sandbox-guard wrapping the primary (delegate mode)"
new_act delegate
write_conflist "{ \"type\": \"sandbox-guard\", $(guard_keys),"$'\n    '"\"delegate\": $(primary_entry) }"
say "The guard stands where the primary stood and runs it itself (same CNI_* environment, the" \
	"\"delegate\" object as its config): every ADD and DEL reaches the guard before the primary."
start_both
del_a_banner
# The guard warns on stderr too; its log, shown below, has the same line.
out=$(libcni del "$sandbox_a" "$ns_a" 1 2>&1) || die "the stale DEL of A failed in delegate mode: $out"
grep -q " DEL $sandbox_a " "$act_dir/primary/calls.log" && die "the primary saw the stale DEL of A"
has_eth0 "$ns_a" && die "A's netns still holds eth0 after its DEL"
reachable "$ip_b" || die "B ($ip_b) is unreachable after DEL A"
[[ $(ipam_holder "$ip_b") == lijiaob.etcd1-0 ]] || die "the primary no longer holds $ip_b for the pod"
good "DEL A succeeded, and the primary never saw it: B is reachable, $ip_b still B's." \
	"containerd's StopPodSandbox of A succeeds on its first try."
say "A's netns holds no interface: the guard looks there for the one it checkpointed (same name and" \
	"MAC) and deletes it; with this primary, B's ADD had taken it already. The guard's log:"
grep -m1 'outcome=deferred' "$act_dir/guard.log" | short_log
step "containerd's RemovePodSandbox of A: DEL A again, with an empty netns"
out=$(libcni del "$sandbox_a" "" 1 2>&1) || die "the second DEL of A failed in delegate mode: $out"
"$guard_bin" --dump-checkpoints --state-dir "$act_dir/guard" --output json | grep -q '"status": *"deferred"' ||
	die "the dump lists no deferred DEL"
good "Succeeded too: A is removed from the node on the first try; nothing is left to retry." \
	"The guard holds A's DEL, durably, until the pod name is free (--dump-checkpoints):"
dump
step "The pod is deleted for good: DEL B"
libcni del "$sandbox_b" "$ns_b" 2 || die "DEL B failed"
good "B owned the pod name: the primary got DEL B and released B's endpoint and address. With the" \
	"name free, the guard replayed A's deferred DEL to the primary (empty CNI_NETNS, A's CNI_ARGS," \
	"A's result as prevResult), as containerd's second DEL would have come:"
grep -e 'outcome=replayed' -e 'outcome=replay-failed' "$act_dir/guard.log" | short_log
grep -q 'outcome=replayed' "$act_dir/guard.log" || die "the deferred DEL of A was not replayed"
say "The DELs the primary got, in its own trace:"
primary_dels
[[ -z $(primary_holds) ]] || die "the primary still holds an address or endpoint"
dump_json=$("$guard_bin" --dump-checkpoints --state-dir "$act_dir/guard" --output json)
[[ $dump_json == "[]" ]] || die "the guard still holds checkpoints or deferred DELs: $dump_json"
good "Nothing left: no address or endpoint in the primary, no checkpoint or deferred DEL in the guard."
outcome[delegate]="DEL A succeeded at once, B kept its network; the primary got A's DEL after B's"
say "This act showed: ${outcome[delegate]}."
end_act

# --- summary -------------------------------------------------------------------------------
act "Summary: ADD A, ADD B (same pod name), DEL A"
printf '    %-10s %s\n' "no guard" "${outcome[unguarded]}" \
	"chained" "${outcome[chained]}" \
	"delegate" "${outcome[delegate]}"
say "" "Next, on a node of yours (the binary is $guard_bin):" \
	"  sandbox-guard --doctor                 what this node's CNI config and state say, each finding with its fix" \
	"  sandbox-guard --dump-checkpoints       which sandbox owns each pod name; what is superseded or deferred" \
	"  sandbox-guard --install --mode delegate --entry '{\"staleDel\":\"audit\"}'" \
	"                                         install it wrapping a pod-name-keyed primary, auditing first" \
	"  On a cluster: README.md, \"Install on a cluster, in the safe order\"."
printf '\n%sDemo complete in %d s; removing namespaces, links and %s.%s\n' "$bold" "$SECONDS" "$work" "$reset"
