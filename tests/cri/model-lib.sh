# Needs: cat cut date flock ip mkdir nsenter rm sed seq sha1sum sleep tr
# Sourced (never run) by the test-only model primaries in this directory: the CNI plumbing
# they share (config and CNI_ARGS reading, errors, the call trace, the injected failure, IP
# allocation and the veth wiring), so that each plugin file holds only what it models: how
# the primary keys its state and what its ADD and DEL tear down.
#
# A plugin may set, before sourcing: model_versions (the supportedVersions its VERSION lists,
# as JSON strings; default "0.4.0","1.0.0") and model_default_version (the version of a config
# without cniVersion; default 1.0.0).
#
# Sourcing reads the plugin's config from stdin, answers VERSION, rejects the verbs the models
# do not implement, opens the state dir and reads the pod's identity; it leaves in the caller's
# scope: config, cni_version, state_dir, ipam_dir, namespace, pod, ifname. The state dir's lock is held
# for the whole run (one run at a time) unless the plugin set model_lock=store before sourcing:
# then it takes the lock around each change of its stores only (lock_store, unlock_store), as a
# primary whose datastore makes each change atomic and takes no node-wide lock.
#
# Config keys every model reads (plugin entry): stateDir (required), subnet (a /24, e.g.
# "100.64.3.0/24"), hostVethPrefix (default "cali"). A file "fail-next-del" in stateDir makes
# the next DEL fail before touching anything and is consumed: it stands in for the primary's
# own first failure that makes kubelet retry.
#
# ipam_dir: where allocate_ip and release_ips_of keep the addresses (ipam_dir/ips/<ip>, its
# holder's key; ipam_dir/allocated-by/<ip>, a model's record of who took it): the state dir,
# unless the plugin moves it after sourcing.
#
# The trace, stateDir/calls.log: one line per call, "<time> <VERB> <container> <key>
# netns=<CNI_NETNS>", then indented lines saying what the call did to whose resources.
set -u
export LC_ALL=C

readonly GATEWAY=169.254.1.1
config=$(tr -d '\n')

# Reads a string value from the config. Our own conflists only have flat string keys, so a
# regular expression is enough and keeps the plugins free of jq.
conf() {
    printf '%s' "$config" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p"
}

cni_arg() {
    local pair
    IFS=';' read -ra pairs <<<"${CNI_ARGS:-}"
    for pair in "${pairs[@]}"; do
        [[ $pair == "$1="* ]] && { printf '%s' "${pair#*=}"; return; }
    done
}

cni_version=$(conf cniVersion)
cni_version=${cni_version:-${model_default_version:-1.0.0}}

fail() { # code message
    printf '{"cniVersion":"%s","code":%d,"msg":"%s"}\n' "$cni_version" "$1" "$2"
    exit 1
}

# Every host command goes through here so a failure becomes a CNI error, not a half setup.
# (Quotes and backslashes are dropped so the message stays a valid JSON string.)
# shellcheck disable=SC1003
must() {
    local out
    out=$("$@" 2>&1) || fail 5 "$(printf '%s' "$* : $out" | tr -d '"\\' | tr '\n' ' ')"
}

case "${CNI_COMMAND:-}" in
VERSION)
    printf '{"cniVersion":"%s","supportedVersions":[%s]}\n' "$cni_version" "${model_versions:-\"0.4.0\",\"1.0.0\"}"
    exit 0 ;;
ADD | DEL | CHECK) ;;
*) fail 4 "unsupported CNI_COMMAND ${CNI_COMMAND:-}" ;;
esac

state_dir=$(conf stateDir)
[[ -n $state_dir ]] || fail 7 "stateDir is required"
mkdir -p "$state_dir/ips" "$state_dir/links" || fail 5 "cannot create $state_dir"
ipam_dir=$state_dir
# A file "hung-dels" in stateDir (seconds) makes every DEL wait that long before it takes the
# lock, after a line "<time> HUNG-DEL <container>" in the trace: a primary blocked on a dead
# datastore that holds nothing the node's other pods need (unlike "slow-dels", below, which
# holds the lock as a slow IPAM run does).
if [[ ${CNI_COMMAND:-} == DEL && -f $state_dir/hung-dels ]]; then
    printf '%s HUNG-DEL %s\n' "$(date +%T.%N)" "${CNI_CONTAINERID:-}" >>"$state_dir/calls.log"
    sleep "$(cat "$state_dir/hung-dels")"
fi
exec 9>"$state_dir/lock"
lock_store() { flock 9; }
unlock_store() { flock -u 9; }
[[ ${model_lock:-run} == store ]] || lock_store

namespace=$(cni_arg K8S_POD_NAMESPACE)
pod=$(cni_arg K8S_POD_NAME)
[[ -n $namespace && -n $pod ]] || fail 4 "CNI_ARGS lacks K8S_POD_NAMESPACE or K8S_POD_NAME"
ifname=${CNI_IFNAME:-eth0}
[[ -n ${CNI_CONTAINERID:-} ]] || fail 4 "CNI_CONTAINERID is required"

# log_call KEY: the call's line in the trace, KEY being what the model keys it by. The
# call's start, in seconds since the epoch, is kept for a failure's line (fail_if_injected).
log_call() {
    call_started=$(date +%s.%N)
    printf '%s %s %s %s netns=%s\n' "$(date -d "@$call_started" +%T.%N)" "$CNI_COMMAND" \
        "$CNI_CONTAINERID" "$1" "${CNI_NETNS:-}" >>"$state_dir/calls.log"
}

trace() {
    printf '  %s\n' "$*" >>"$state_dir/calls.log"
}

# fail_if_injected WHAT: consumes the fail-next-del marker and fails the DEL naming WHAT. A
# file fail-dels/<namespace>.<pod> holding a count N fails that pod's next N DELs instead, so
# that other pods' DELs on a busy node do not consume the failure meant for one pod. A file
# fail-dels-of/<container> fails every DEL of that sandbox while it exists: a datastore that
# fails one sandbox's teardown until it recovers; its trace line names the sandbox and the
# call's start (calls run at once, so their lines interleave). A file "slow-dels" in stateDir
# (seconds) makes every DEL take that long first: a primary whose datastore is slow.
fail_if_injected() {
    [[ -f $state_dir/slow-dels ]] && sleep "$(cat "$state_dir/slow-dels")"
    if [[ -f $state_dir/fail-dels-of/$CNI_CONTAINERID ]]; then
        trace "DEL failed: injected (fail-dels-of) of $CNI_CONTAINERID started ${call_started:-0}"
        fail 100 "injected primary failure (fail-dels-of) for $1"
    fi
    local counter=$state_dir/fail-dels/$namespace.$pod left
    if [[ -f $counter ]]; then
        left=$(<"$counter")
        if ((left > 0)); then
            echo $((left - 1)) >"$counter"
            trace "DEL failed: injected (fail-dels, $((left - 1)) left)"
            fail 100 "injected primary failure (fail-dels) for $1"
        fi
    fi
    [[ -f $state_dir/fail-next-del ]] || return 0
    rm -f "$state_dir/fail-next-del"
    trace "DEL failed: injected (fail-next-del)"
    fail 100 "injected primary failure (fail-next-del) for $1"
}

# A file "slow-adds" in stateDir (seconds) makes every ADD take that long, after its line in
# the trace: an ADD still in the primary while a test switches the guard's binary.
slow_add_if_asked() {
    [[ -f $state_dir/slow-adds ]] && sleep "$(cat "$state_dir/slow-adds")"
    return 0
}

# A file hold-adds/<namespace>.<pod> (seconds) holds that pod's next ADD that long once its
# endpoint is written, and goes: an ADD at the primary with its state made, for a test to cut
# off by restarting the runtime, or to outlive kubelet's RunPodSandbox deadline. The wait is a child process carrying the call's environment,
# as an IPAM plugin the primary runs is, without the call's pipes, and MODEL_HOLD=<container>
# so that a test finds it and nothing else of that sandbox's calls.
hold_add_if_asked() {
    local hold=$state_dir/hold-adds/$namespace.$pod seconds
    [[ -f $hold ]] || return 0
    seconds=$(<"$hold")
    rm -f "$hold"
    trace "held: ADD of $CNI_CONTAINERID, its endpoint written (hold-adds, ${seconds}s)"
    MODEL_HOLD=$CNI_CONTAINERID sleep "$seconds" </dev/null >/dev/null 2>&1 9>&-
}

# host_veth_name KEY: calico's host-side name, the prefix and a hash of KEY cut to 15 bytes
# (calico: "cali" + sha1(KEY)[:11]).
host_veth_name() {
    local prefix
    prefix=$(conf hostVethPrefix)
    prefix=${prefix:-cali}
    printf '%s%s' "$prefix" "$(printf '%s' "$1" | sha1sum | cut -c1-$((15 - ${#prefix})))"
}

# The container that created host link $1 (the trace's way to name whose link went).
link_creator() {
    cat "$state_dir/links/$1" 2>/dev/null || printf 'nobody'
}

# delete_host_link NAME WHY: deletes the host link NAME if it exists, saying in the trace whose
# it was; the veth's pod end (and its address) goes with it.
delete_host_link() {
    [[ -e /sys/class/net/$1 ]] || { rm -f "$state_dir/links/$1"; return 0; }
    trace "$CNI_COMMAND by $CNI_CONTAINERID deletes host link $1 of $(link_creator "$1") ($2)"
    ip link del "$1" 2>/dev/null
    rm -f "$state_dir/links/$1"
}

# allocate_ip HANDLE: takes the first free address of the subnet for HANDLE into $ip.
allocate_ip() {
    local subnet n
    subnet=$(conf subnet)
    subnet=${subnet:-100.64.0.0/24}
    for n in $(seq 2 254); do
        ip="${subnet%.*/*}.$n"
        (set -o noclobber; printf '%s' "$1" >"$ipam_dir/ips/$ip") 2>/dev/null && return 0
    done
    ip=
    fail 5 "subnet $subnet exhausted"
}

# release_ips_of HANDLE: frees every address HANDLE holds, saying which in the trace.
release_ips_of() {
    local ip_file
    for ip_file in "$ipam_dir"/ips/*; do
        [[ -f $ip_file && $(<"$ip_file") == "$1" ]] || continue
        # Who took it (a model's record, if it keeps one) goes first, with the address.
        rm -f "$ipam_dir/allocated-by/${ip_file##*/}" "$ip_file"
        trace "DEL by $CNI_CONTAINERID releases ${ip_file##*/} of handle $1"
    done
}

# read_pod_mac: the MAC of CNI_IFNAME in CNI_NETNS. Asked over netlink: nsenter keeps the host's
# /sys mounted, so /sys/class/net there would describe the host's link of that name.
read_pod_mac() {
    nsenter --net="$CNI_NETNS" ip -o link show dev "$ifname" | sed -n 's/.* link\/ether \([0-9a-f:]*\) .*/\1/p'
}

# Removes CNI_IFNAME from CNI_NETNS, if both are there (the host end goes with it).
delete_pod_end() {
    [[ -n ${CNI_NETNS:-} && -e $CNI_NETNS ]] || return 0
    nsenter --net="$CNI_NETNS" ip link del "$ifname" 2>/dev/null &&
        trace "DEL by $CNI_CONTAINERID deletes $ifname in its netns"
    return 0
}

# wire_veth HOST_VETH IP: a veth whose host end is HOST_VETH and whose pod end is CNI_IFNAME
# in CNI_NETNS with IP/32, the pod's default route via the link-local gateway, the host's /32
# route to the pod; then prints the CNI result. Calico answers for 169.254.1.1 with proxy ARP;
# owning the address on the host end instead keeps the tests independent of the host's
# forwarding and ARP sysctls.
wire_veth() {
    local host_veth=$1 ip=$2 tmp_peer host_mac pod_mac version_field=''
    tmp_peer="tmp$(printf '%s' "$CNI_CONTAINERID" | cut -c1-12)"
    must ip link add "$host_veth" type veth peer name "$tmp_peer"
    printf '%s' "$CNI_CONTAINERID" >"$state_dir/links/$host_veth"
    must ip link set "$tmp_peer" netns "$CNI_NETNS"
    must nsenter --net="$CNI_NETNS" ip link set "$tmp_peer" name "$ifname"
    must nsenter --net="$CNI_NETNS" ip addr add "$ip/32" dev "$ifname"
    must nsenter --net="$CNI_NETNS" ip link set "$ifname" up
    must nsenter --net="$CNI_NETNS" ip route add "$GATEWAY" dev "$ifname" scope link
    must nsenter --net="$CNI_NETNS" ip route add default via "$GATEWAY" dev "$ifname"
    must ip addr add "$GATEWAY/32" dev "$host_veth" scope link
    must ip link set "$host_veth" up
    # replace: a route left to an address that a stale DEL freed goes to the newest holder,
    # as felix routes an address to its newest endpoint; the older holder loses it.
    must ip route replace "$ip/32" dev "$host_veth" src "$GATEWAY"

    host_mac=$(cat "/sys/class/net/$host_veth/address")
    pod_mac=$(read_pod_mac)
    if [[ $cni_version == 0.1.0 || $cni_version == 0.2.0 ]]; then
        # The 0.2.0 shape, as libcni converts an IPAM result of one /32 without routes:
        # ip4 alone, no interfaces.
        printf '{"cniVersion":"%s","ip4":{"ip":"%s/32"},"dns":{}}\n' "$cni_version" "$ip"
        return
    fi
    [[ $cni_version == 0.* ]] && version_field='"version":"4",'
    printf '{"cniVersion":"%s","interfaces":[{"name":"%s","mac":"%s"},{"name":"%s","mac":"%s","sandbox":"%s"}],"ips":[{%s"address":"%s/32","gateway":"%s","interface":1}],"routes":[{"dst":"0.0.0.0/0","gw":"%s"}],"dns":{}}\n' \
        "$cni_version" "$host_veth" "$host_mac" "$ifname" "$pod_mac" "$CNI_NETNS" \
        "$version_field" "$ip" "$GATEWAY" "$GATEWAY"
}
