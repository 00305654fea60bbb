# Run by `scripts/demo.sh --real-node`: the incident on a real node (scripts/node.sh: kubelet,
# the API server, the StatefulSet controller, containerd 2.2), driven through the API only.
# A StatefulSet pod is deleted the normal way; kubelet's container GC then stops and removes
# the old sandbox about a minute later, after the new pod took the name. Without the guard
# the pod-name-keyed primary tears down the new pod's network; with the guard's DaemonSet in
# its default (delegate) mode it does not. The node is taken down on exit.
#
# Expects from demo.sh: repo, guard_bin, and its act/step/say/good/bad helpers.

node_sh() { bash "$repo/scripts/node.sh" "$@"; }
kubectl_node() { node_sh kubectl "$@"; }

demo_node_cleanup() {
  local status=$?
  step "Taking the node down"
  # down fails naming what it left; the demo's own cleanup must still run after it.
  node_sh down 2>&1 | indent || true
  # Then the demo's own cleanup, with the status the demo ended with.
  (exit "$status")
  cleanup
}

# A one-replica StatefulSet in namespace $1, the pause image as its database.
statefulset_etcd1() {
  kubectl_node apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: { name: $1 }
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: etcd1, namespace: $1 }
spec:
  serviceName: etcd1
  replicas: 1
  selector: { matchLabels: { app: etcd1 } }
  template:
    metadata: { labels: { app: etcd1 } }
    spec:
      terminationGracePeriodSeconds: 1
      automountServiceAccountToken: false
      enableServiceLinks: false
      containers:
        - { name: db, image: $pause_image, imagePullPolicy: Never }
YAML
}

pod_field() { kubectl_node -n "$1" get pod etcd1-0 -o "jsonpath=$2" 2>/dev/null || true; }

wait_new_pod() { # namespace, old uid: prints the new pod's IP once Ready
  local ns=$1 old=$2 uid ready
  for _ in $(seq 240); do
    uid=$(pod_field "$ns" '{.metadata.uid}')
    ready=$(pod_field "$ns" '{.status.conditions[?(@.type=="Ready")].status}')
    if [[ -n $uid && $uid != "$old" && $ready == True ]]; then
      pod_field "$ns" '{.status.podIP}'
      return 0
    fi
    sleep 0.5
  done
  die "etcd1-0 did not come back Ready in $ns"
}

# One act: the pod made, deleted as `kubectl delete pod` does, re-created by the controller,
# then kubelet's container GC waited for (it repeats the old sandbox's DEL).
node_act() {
  local ns=$1 ip uid calls
  statefulset_etcd1 "$ns"
  ip=$(wait_new_pod "$ns" none)
  uid=$(pod_field "$ns" '{.metadata.uid}')
  say "etcd1-0 is Ready at $ip"
  calls=$(wc -l <"$node_dir/cni/primary/calls.log")
  step "kubectl delete pod etcd1-0 (kubelet stops sandbox A; the controller re-creates the pod)"
  kubectl_node -n "$ns" delete pod etcd1-0 --wait=false | indent
  ip=$(wait_new_pod "$ns" "$uid")
  if reachable "$ip"; then good "the new etcd1-0 is Ready at $ip and answers ping"; else bad "the new etcd1-0 at $ip does not answer"; fi
  step "Waiting for kubelet's container GC to remove sandbox A (it runs once a minute)"
  local waited=0
  while ((waited < 75)) && ! tail -n +"$((calls + 1))" "$node_dir/cni/primary/calls.log" | grep -q 'netns=$'; do
    sleep 5
    waited=$((waited + 5))
  done
  sleep 3
  say "what the primary was asked since the delete (its trace):"
  tail -n +"$((calls + 1))" "$node_dir/cni/primary/calls.log" | sed 's/netns=.*//' | short_ids | indent
  if reachable "$ip"; then
    good "etcd1-0 at $ip still answers ping after kubelet's GC"
  else
    bad "etcd1-0 at $ip no longer answers: the GC's DEL of sandbox A released the new pod's address and endpoint"
  fi
}

demo_real_node() {
  trap demo_node_cleanup EXIT
  act "The incident on a real node: kubelet, the API server, the StatefulSet controller, containerd 2.2"
  step "Starting the node (scripts/node.sh up; the first run builds Kubernetes from its Go modules, which takes minutes)"
  local env
  env=$(node_sh up) || die "the node did not come up"
  pause_image=$(sed -n 's/^PAUSE_IMAGE=//p' <<<"$env")
  node_dir=$(sed -n 's/^NODE_DIR=//p' <<<"$env")
  step "Building the guard's image around the demo's binary and importing it into the node"
  local archive
  archive=$(SANDBOX_GUARD_BIN=$guard_bin bash "$repo/scripts/image.sh" "" localhost/sandbox-guard:demo) ||
    die "scripts/image.sh failed"
  node_sh ctr images import "$archive" >/dev/null

  act "Act 1: no guard"
  node_act demo-unguarded

  act "Act 2: the guard's DaemonSet, as conf-examples/kubernetes installs it (delegate mode)"
  node_sh guard install delegate localhost/sandbox-guard:demo 2>&1 | tail -1 | indent
  node_act demo-guarded
  say "the guard's log: the old sandbox's DELs after the new pod took the name"
  grep "outcome=deferred" "$(sed -n "s/^GUARD_LOG=//p" <<<"$env")" | tail -2 | short_log
  step "Next: bash scripts/node.sh up, then watch it yourself (bash scripts/node.sh kubectl ...); docs/real-node.md"
}
