#!/bin/bash
# Makes testdata/upgrade/state-v1/: a state dir as the release before the pod-key change
# (owners, deferred DELs, ledger and pod locks keyed by (network, namespace, name, ifname))
# left it. Run once with that release's binary; the upgrade tests start from a copy.
#   bash testdata/upgrade/make-state-v1.sh OLD-BINARY testdata/upgrade/state-v1
set -eu
old=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
primary=$(cd "$here/../../tests/primaries" && pwd)/recording-plugin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
ln -s "$primary" "$work/bin/recording-primary"
state=$work/state
net=k8s-pod-network
id() { printf '%s%.0s' "$(printf '%s' "$1" | sha256sum | cut -c1-64)"; }
result() { # container ifname
    printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","mac":"0a:58:0a:16:00:%02x","sandbox":"/var/run/netns/cni-%s"}],"ips":[{"address":"10.22.0.%d/16","gateway":"10.22.0.1","interface":0}]}' \
        "$2" "$3" "${1:0:12}" "$3"
}
# guard VERB CONTAINER IFNAME POD UID MODE(chained|delegate) N
guard() {
    local verb=$1 container=$2 ifname=$3 pod=$4 uid=$5 mode=$6 n=$7 conf
    conf='{"cniVersion":"1.0.0","name":"'$net'","type":"sandbox-guard","stateDir":"'$state'"'
    if [[ $mode == delegate ]]; then
        conf+=',"delegate":{"type":"recording-primary","stateDir":"'$work/primary'"}'
    fi
    if [[ $mode == chained || $verb == DEL ]]; then
        conf+=',"prevResult":'$(result "$container" "$ifname" "$n")
    fi
    conf+='}'
    printf '%s' "$conf" | env -i PATH=/usr/bin:/bin CNI_COMMAND=$verb CNI_CONTAINERID=$container \
        CNI_NETNS=/var/run/netns/cni-${container:0:12} CNI_IFNAME=$ifname CNI_PATH=$work/bin \
        CNI_ARGS="K8S_POD_INFRA_CONTAINER_ID=$container;K8S_POD_UID=$uid;IgnoreUnknown=1;K8S_POD_NAMESPACE=lijiaob;K8S_POD_NAME=$pod" \
        "$old" || true
    echo
}
a=$(id a) b=$(id b) c=$(id c) d=$(id d) e=$(id e) f=$(id f)
# etcd1-0: A as net1, then B as net2 (a template change); the old release gives each its own key.
guard ADD "$a" net1 etcd1-0 uid-a chained 1
guard ADD "$b" net2 etcd1-0 uid-b chained 2
# web-0: C, then D, both eth0; C's stale DEL is refused and counted in the ledger.
guard ADD "$c" eth0 web-0 uid-c chained 3
guard ADD "$d" eth0 web-0 uid-d chained 4
guard DEL "$c" eth0 web-0 uid-c chained 3
# db-0, delegate mode: E, then F, both eth0; E's stale DEL is deferred.
guard ADD "$e" eth0 db-0 uid-e delegate 5
guard ADD "$f" eth0 db-0 uid-f delegate 6
guard DEL "$e" eth0 db-0 uid-e delegate 5
rm -rf "$out"
mkdir -p "$out"
cp -a "$state/." "$out/"
# The lock file's counters are the store's own; git keeps the rest as plain files.
printf 'a=%s\nb=%s\nc=%s\nd=%s\ne=%s\nf=%s\n' "$a" "$b" "$c" "$d" "$e" "$f" > "$out/../state-v1.ids"
