#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine (or two nodes: up --nodes 2), for
# watching and testing the guard under a real kubelet: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd with runc and kubelet, all built from their
# Go modules (scripts/lib/node-build.sh) or Debian's packages, on loopback, under one work dir.
# The CNI network is the calico-cni v1 model primary (tests/cri/calico-cni-v1-model-plugin,
# calico 2.1's keying); no guard: put it on as a user does (scripts/image.sh, ctr import, kubectl apply).
#
#   bash scripts/node.sh up [--runtime containerd2|containerd16] [--runtime-request-timeout S]
#                           [--terminated-pod-gc-threshold N] [--nodes 2]
#                                             # prints KUBECONFIG=... last; S: kubelet's, 120;
#                                             # N: kube-controller-manager's, 12500; --nodes 2:
#                                             # a second node, sg-node-b (docs/real-node.md)
#   bash scripts/node.sh up --api-only        # etcd and kube-apiserver alone, with RBAC: for the
#                                             # tests that only ask the API (prints KUBECONFIG=... last)
#   bash scripts/node.sh down                 # leaves no process, mount, netns, link or chain
#   bash scripts/node.sh build [--runtime R]  # only builds (or finds cached) the components
#   bash scripts/node.sh restart kubelet|containerd [--kill]   # --kill: SIGKILL, not SIGTERM
#   bash scripts/node.sh stop kubelet | start kubelet   # a node's kubelet gone, then back (failover)
#   bash scripts/node.sh guard install delegate|chained IMAGE [--api-view]   # the DaemonSet, as an
#                                             # operator applies it; --api-view: with the API
#                                             # server's view on (podKeyScope "cluster")
#   bash scripts/node.sh guard uninstall IMAGE                  # the uninstall DaemonSet, then gone
#   bash scripts/node.sh multus install thin|thick   # multus v4 in front of the node's network
#   bash scripts/node.sh multus remove
#   bash scripts/node.sh primary bridge|model|cilium-chained   # Debian's bridge + host-local,
#                                             # the model, or aws-cni + cilium-cni (models)
#   bash scripts/node.sh kubectl ARGS... | crictl ARGS... | ctr ARGS...
#   bash scripts/node.sh env                  # the running node's variables, as `up` printed
#   bash scripts/node.sh --node b env|restart ...|crictl ...|ctr ...   # the same on node b
#
# containerd16 is Debian's containerd 1.6 and containerd2 containerd 2.x from its module: both
# run a DEL on every StopPodSandbox; 2.x ignores its failure when it holds no CNI result.
# SANDBOX_GUARD_NODE_DIR: the work dir (default /var/tmp/sandbox-guard-node);
# SANDBOX_GUARD_NODE_CACHE: the build cache (default /var/cache/sg-node). Needs root.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/lib/packages.sh"
. "$repo/scripts/lib/node-build.sh"
help_if_asked "${BASH_SOURCE[0]}" 35 "${1:-}"

W=${SANDBOX_GUARD_NODE_DIR:-/var/tmp/sandbox-guard-node}
NODE_NAME=sg-node
# Loopback and addresses of this machine only: the node's own address sits on lo (kubelet
# refuses a loopback node IP), pods get the model's /24 behind host routes.
NODE_IP=100.100.1.1
POD_SUBNET=100.100.0.0/24
SERVICE_RANGE=100.100.128.0/24
# Every port below the kernel's default ephemeral range (32768-60999): a socket given a port
# in that range (a client's, or a listener's on port 0) can hold the one a component binds
# next, and that component exits.
ETCD_PORT=32379
ETCD_PEER_PORT=32380
APISERVER_PORT=30443
KUBELET_PORT=30250
KUBELET_HEALTHZ_PORT=30248
CONTROLLER_MANAGER_PORT=30257
SCHEDULER_PORT=30259
NODE_PORTS=("$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT"
  "$CONTROLLER_MANAGER_PORT" "$SCHEDULER_PORT")
# kubelet's runtimeRequestTimeout (its config, below), its default unless up is given one:
# RunPodSandbox gets twice this, StopPodSandbox and RemovePodSandbox this.
RUNTIME_REQUEST_TIMEOUT_SECONDS=120
# kube-controller-manager's --terminated-pod-gc-threshold, its default unless up is given one:
# the pod GC force-deletes the oldest terminated pods beyond it.
TERMINATED_POD_GC_THRESHOLD=12500
NETWORK_NAME=sg-node
VETH_PREFIX=sgn
CGROUP_ROOT=/sandbox-guard-node
# The node's own processes (etcd, the control plane, containerd and what it runs: shims, CNI
# plugins, and the guard's replay workers; kubelet; multus) live in one cgroup beside kubelet's
# pods, so that down ends exactly what the node started. The pids hierarchy limits nothing here.
NODE_CGROUP=/sys/fs/cgroup/pids$CGROUP_ROOT/node
PAUSE_IMAGE=localhost/sandbox-guard-pause:node
TOKEN=sandbox-guard-node-admin
# The guard's state dir on this node, under the work dir rather than the host's /var/lib/cni.
GUARD_STATE=$W/guard/state

# up --nodes 2: node b, sg-node-b, joins the same control plane with a containerd and kubelet
# of its own, both in one mount namespace of their own (kubelet mounts the volumes runc then
# binds into containers), in which node b's dirs under NODE_B_DIR are bind-mounted over node
# a's ($W/cni, $W/containerd, ...): the same path, a DaemonSet's hostPath among them, names
# each node's own dir, as on two machines. Node a stays in the host's mount namespace.
NODE_B_DIR=$W/nodes/b
NODE_B_MOUNT_NS=$NODE_B_DIR/ns/mnt
NODE_B_IP=100.100.1.2
# Disjoint from node a's POD_SUBNET, the node addresses' 100.100.1.0/24 and SERVICE_RANGE.
NODE_B_POD_SUBNET=100.100.2.0/24
NODE_B_KUBELET_PORT=30251
NODE_B_KUBELET_HEALTHZ_PORT=30249
# The dirs of $W that are each node's own, and the host paths kubelet and containerd use that
# no config here sets (kubelet's device-plugin socket, a constant; containerd's NRI socket).
NODE_OWN_DIRS=(cni containerd kubelet guard pod-logs)
NODE_OWN_HOST_DIRS=(/var/lib/kubelet /run/nri)
# The model primary's IPAM store (calico's etcd: handles and addresses for the whole cluster),
# shared by both nodes, outside their own dirs; endpoints stay in each node's stateDir.
IPAM_DIR=$W/ipam

# Args write_overlay adds to the installer's (guard install --api-view), and whether its mounts
# of the node's CNI dirs at the host's paths are read-only (only the probe reads them otherwise).
OVERLAY_ADD_ARGS=()
OVERLAY_CNI_READ_ONLY=true

# The node a command acts on (--node): a, or b, whose dirs the host sees under NODE_B_DIR
# and whose commands run in its mount namespace (NODE_EXEC).
NODE=a
NODE_HOST_DIR=$W
NODE_EXEC=()
NODE_SUFFIX=''
KUBELET_CGROUP_ROOT=$CGROUP_ROOT

# The script's own messages go to fd 3, the stderr it was started with: wait_for silences its
# check's output, and a component's death is reported from inside that check (alive_and).
exec 3>&2
say() { echo "node: $*" >&3; }
die() {
  echo "node: $*" >&3
  exit 1
}

bin_k8s() { echo "$NODE_CACHE/bin/kubernetes-$K8S_VERSION/$1"; }

two_nodes() { [[ -d $NODE_B_DIR ]]; }

select_node() {
  case $1 in
    a) ;;
    b)
      NODE=b
      NODE_NAME=sg-node-b
      NODE_IP=$NODE_B_IP
      POD_SUBNET=$NODE_B_POD_SUBNET
      KUBELET_PORT=$NODE_B_KUBELET_PORT
      KUBELET_HEALTHZ_PORT=$NODE_B_KUBELET_HEALTHZ_PORT
      # Its own host veth names: both nodes' links share the host's network namespace, and a
      # pod of one name on both nodes would otherwise get one name on both.
      VETH_PREFIX=sgnb
      # Nested in node a's root, so that down finds both nodes' processes and cgroups there.
      KUBELET_CGROUP_ROOT=$CGROUP_ROOT/b
      NODE_CGROUP=/sys/fs/cgroup/pids$CGROUP_ROOT/b/node
      NODE_HOST_DIR=$NODE_B_DIR
      NODE_EXEC=(nsenter --mount="$NODE_B_MOUNT_NS" --)
      NODE_SUFFIX=-b
      ;;
    *) die "--node takes a or b, not '$1'" ;;
  esac
}

kubectl_() { "$(bin_k8s kubectl)" --kubeconfig "$W/kubeconfig" "$@"; }

runtime_of_node() { cat "$W/runtime" 2>/dev/null || echo containerd16; }
# The running node's Kubernetes (containerd 2.2's when none is up: what scripts/test.sh
# builds); `up` and `build` set their runtime's.
K8S_VERSION=$(k8s_version "$(cat "$W/runtime" 2>/dev/null || echo containerd2)")

containerd_bin_dir() {
  case $1 in
    containerd16) echo /usr/bin ;;
    containerd2) echo "$NODE_CACHE/bin/containerd-$CONTAINERD2_VERSION" ;;
  esac
}

crictl_() {
  "${NODE_EXEC[@]}" "$NODE_CACHE/bin/cri-tools-$CRITOOLS_VERSION/crictl" \
    --runtime-endpoint "unix://$W/containerd/containerd.sock" \
    --image-endpoint "unix://$W/containerd/containerd.sock" --timeout 30s "$@"
}

ctr_() {
  "${NODE_EXEC[@]}" "$(containerd_bin_dir "$(runtime_of_node)")/ctr" --address "$W/containerd/containerd.sock" \
    --namespace k8s.io "$@"
}

build_all() {
  local runtime=$1
  node_go_env
  build_kubernetes
  build_etcd
  build_crictl
  [[ $runtime == containerd2 ]] && build_containerd2
  return 0
}

# start NAME CMD...: runs CMD in its own session and in the node's cgroup (joined before the
# exec, so every child is in it too), logging to $W/logs/NAME.log.
start() {
  local name=$1
  shift
  mkdir -p "$NODE_CGROUP"
  setsid sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$NODE_CGROUP" "$@" \
    </dev/null >>"$W/logs/$name.log" 2>&1 3>&- &
  echo $! >"$W/run/$name.pid"
}

# stop NAME [SIGNAL]: SIGTERM (or SIGNAL), then SIGKILL after 10 s.
stop() {
  local name=$1 signal=${2:-TERM} pid
  pid=$(cat "$W/run/$name.pid" 2>/dev/null) || return 0
  rm -f "$W/run/$name.pid"
  kill "-$signal" "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# alive_and NAME CMD...: CMD's status while the component NAME runs; once it has exited, says
# so with the tail of its log and stops the script.
alive_and() {
  local name=$1
  shift
  if ! kill -0 "$(cat "$W/run/$name.pid")" 2>/dev/null; then
    tail -5 "$W/logs/$name.log" >&3
    die "$name exited (log: $W/logs/$name.log)"
  fi
  "$@"
}

# wait_for WHAT SECONDS CMD...: polls CMD every half second, a progress line every 10 s.
wait_for() {
  local what=$1 limit=$2 started=$SECONDS next=10
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS - started >= limit)); then
      # The check's own output, and the log of the component it watches, say why.
      "$@" 2>&1 | tail -5 >&3 || true
      [[ $1 != alive_and ]] || tail -5 "$W/logs/$2.log" >&3 || true
      say "timed out after ${limit} s waiting for $what; logs in $W/logs"
      return 1
    fi
    if ((SECONDS - started >= next)); then
      say "waiting for $what ($((SECONDS - started)) s)"
      next=$((next + 10))
    fi
    sleep 0.5
  done
  say "$what ($((SECONDS - started)) s)"
}

write_pki() {
  mkdir -p "$W/pki"
  openssl genrsa -out "$W/pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$W/pki/sa.key" -pubout -out "$W/pki/sa.pub" 2>/dev/null
  # A CA, which kube-root-ca.crt publishes to pods and the kubeconfigs name, and the API
  # server's serving certificate signed by it: a client that checks the chain as webpki does
  # refuses a self-signed CA certificate served as the server's own.
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=sandbox-guard-node-ca" \
    -keyout "$W/pki/ca.key" -out "$W/pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=sandbox-guard-node" \
    -keyout "$W/pki/apiserver.key" -out "$W/pki/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$W/pki/apiserver.csr" -CA "$W/pki/ca.crt" -CAkey "$W/pki/ca.key" \
    -CAcreateserial -days 30 -out "$W/pki/apiserver.crt" \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1,IP:%s,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$NODE_IP") 2>/dev/null
  echo "$TOKEN,admin,admin,system:masters" >"$W/pki/tokens.csv"
  chmod 600 "$W/pki/"*
  cat >"$W/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: node
    cluster: { server: "https://127.0.0.1:$APISERVER_PORT", certificate-authority: "$W/pki/ca.crt" }
users:
  - name: admin
    user: { token: "$TOKEN" }
contexts:
  - name: node
    context: { cluster: node, user: admin }
current-context: node
EOF
  chmod 600 "$W/kubeconfig"
}

# The pause image: catatonit (Debian's, static) FROM scratch, imported offline.
pause_image_archive() {
  local dir=$W/pause-image
  mkdir -p "$dir/rootfs"
  cp /usr/bin/catatonit "$dir/rootfs/catatonit"
  tar --numeric-owner --owner=0 --group=0 -C "$dir/rootfs" -cf "$dir/layer.tar" catatonit
  local digest arch
  digest=$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)
  arch=$(dpkg --print-architecture)
  printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/catatonit","-P"],"Env":["PATH=/"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$arch" "$digest" >"$dir/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$PAUSE_IMAGE" >"$dir/manifest.json"
  tar -C "$dir" -cf "$dir/pause.tar" manifest.json config.json layer.tar
  echo "$dir/pause.tar"
}

# Writes the node's own files where the host sees them (NODE_HOST_DIR), naming paths as the
# node's own processes see them ($W).
write_cni() {
  local h=$NODE_HOST_DIR
  mkdir -p "$h/cni/bin" "$h/cni/net.d" "$h/cni/primary"
  # Copies, not links: the guard's DaemonSet sees this dir under its own root, where a link
  # to a host path would point nowhere. The model's shared code lies beside it.
  local plugin
  for plugin in loopback bridge host-local portmap tuning; do
    cp "/usr/lib/cni/$plugin" "$h/cni/bin/$plugin"
  done
  cp "$repo/tests/cri/calico-cni-v1-model-plugin" "$h/cni/bin/calico-cni-v1-model"
  cp "$repo/tests/cri/model-lib.sh" "$h/cni/bin/model-lib.sh"
  # Two nodes share the model's IPAM, as calico's nodes share its etcd.
  local ipam=''
  if two_nodes; then
    mkdir -p "$IPAM_DIR"
    ipam=$'\n      "ipamDir": "'"$IPAM_DIR"'",'
  fi
  cat >"$h/cni/net.d/10-$NETWORK_NAME.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NETWORK_NAME",
  "plugins": [
    {
      "type": "calico-cni-v1-model",
      "stateDir": "$W/cni/primary",$ipam
      "subnet": "$POD_SUBNET",
      "hostVethPrefix": "$VETH_PREFIX",
      "onMissingEndpoint": "ignore"
    }
  ]
}
EOF
}

# The node's network with Debian's bridge and host-local as its primary instead of the model:
# a primary that keys everything by container ID (a bridge port and an address per sandbox),
# as calico 3.x's IPAM and most reference plugins do. The bridge's name starts with the
# node's link prefix, so down removes it.
write_bridge_conflist() {
  mkdir -p "$W/cni/host-local"
  cat >"$W/cni/net.d/10-$NETWORK_NAME.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NETWORK_NAME",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${VETH_PREFIX}br0",
      "isGateway": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_SUBNET" }]],
        "dataDir": "$W/cni/host-local"
      }
    }
  ]
}
EOF
}

# The node's network as aws-cni with cilium-cni chained after it (cilium's aws-cni chaining),
# both test models under the real plugins' types, so that the guard's table of primaries
# knows the chain as it would know the real one: tests/cri/podnamed-veth-plugin (host veths
# named from the pod, addresses by container, its DEL never acting by name) and
# tests/cri/cilium-chained-model-plugin (whose DEL's teardown finds the host veth by name).
write_cilium_chained_conflist() {
  cp "$repo/tests/cri/podnamed-veth-plugin" "$W/cni/bin/aws-cni"
  cp "$repo/tests/cri/cilium-chained-model-plugin" "$W/cni/bin/cilium-cni"
  cat >"$W/cni/net.d/10-$NETWORK_NAME.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NETWORK_NAME",
  "plugins": [
    {
      "type": "aws-cni",
      "stateDir": "$W/cni/primary",
      "subnet": "$POD_SUBNET",
      "hostVethPrefix": "$VETH_PREFIX",
      "delByName": "no"
    },
    {
      "type": "cilium-cni",
      "chaining-mode": "aws-cni",
      "stateDir": "$W/cni/primary"
    }
  ]
}
EOF
}

write_containerd_config() {
  local runtime=$1 c=$W/containerd
  mkdir -p "$NODE_HOST_DIR/containerd"
  case $runtime in
    containerd16)
      cat >"$NODE_HOST_DIR/containerd/config.toml" <<EOF
version = 2
root = "$c/root"
state = "$c/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$c/containerd.sock"
[ttrpc]
  address = "$c/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE on these machines.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$W/cni/bin"
    conf_dir = "$W/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$c/runc"
EOF
      ;;
    containerd2)
      cat >"$NODE_HOST_DIR/containerd/config.toml" <<EOF
version = 3
root = "$c/root"
state = "$c/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$c/containerd.sock"
[ttrpc]
  address = "$c/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  # No CAP_SYS_RESOURCE on these machines.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$W/cni/bin"]
    conf_dir = "$W/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        Root = "$c/runc"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
      ;;
  esac
}

write_kubelet_config() {
  mkdir -p "$NODE_HOST_DIR/kubelet"
  cat >"$NODE_HOST_DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: { enabled: true }
  webhook: { enabled: false }
authorization: { mode: AlwaysAllow }
containerRuntimeEndpoint: unix://$W/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: $KUBELET_CGROUP_ROOT
# These machines run cgroup v1 without swap accounting.
failSwapOn: false
failCgroupV1: false
podLogsDir: $W/pod-logs
resolvConf: /etc/resolv.conf
# No registry can be reached: the imported images must never be collected, and a busy test
# machine must not evict the node's pods.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: { memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%" }
serializeImagePulls: false
runtimeRequestTimeout: ${RUNTIME_REQUEST_TIMEOUT_SECONDS}s
EOF
}

# Node b's mount namespace, kept by a bind mount of its file so that each of its commands can
# enter it, with node b's dirs mounted over node a's. Made before node a's containerd and kubelet
# mount anything: the new namespace gets a copy of every mount the host has, and such a copy
# would keep a netns or a volume of node a's alive after node a unmounts it. slave rather than
# private: they differ only under the host's one shared mount, /run/netns, whose later mounts
# and unmounts then reach the namespace too.
make_node_b_namespace() {
  local ns_dir dir
  ns_dir=$(dirname "$NODE_B_MOUNT_NS")
  mkdir -p "$ns_dir"
  # unshare binds the namespace's file on the host: a mount that propagated it into the new
  # namespace itself would make a loop, which the kernel refuses.
  mount --bind "$ns_dir" "$ns_dir"
  mount --make-private "$ns_dir"
  touch "$NODE_B_MOUNT_NS"
  unshare --mount="$NODE_B_MOUNT_NS" --propagation slave true
  for dir in "${NODE_OWN_DIRS[@]}"; do
    mkdir -p "$W/$dir" "$NODE_B_DIR/$dir"
    nsenter --mount="$NODE_B_MOUNT_NS" -- mount --bind "$NODE_B_DIR/$dir" "$W/$dir"
  done
  for dir in "${NODE_OWN_HOST_DIRS[@]}"; do
    mkdir -p "$dir" "$NODE_B_DIR/host$dir"
    nsenter --mount="$NODE_B_MOUNT_NS" -- mount --bind "$NODE_B_DIR/host$dir" "$dir"
  done
}

start_containerd() {
  local runtime bindir
  runtime=$(runtime_of_node)
  bindir=$(containerd_bin_dir "$runtime")
  start "containerd$NODE_SUFFIX" "${NODE_EXEC[@]}" env PATH="$bindir:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "$bindir/containerd" --config "$W/containerd/config.toml"
  wait_for "containerd$NODE_SUFFIX ($runtime) serving CRI" 60 alive_and "containerd$NODE_SUFFIX" crictl_ version
}

start_kubelet() {
  # kubelet nests its pod cgroups under a root that must exist in every hierarchy.
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/; do
    [[ $hierarchy == */unified/ ]] || mkdir -p "$hierarchy${KUBELET_CGROUP_ROOT#/}"
  done
  start "kubelet$NODE_SUFFIX" "${NODE_EXEC[@]}" "$(bin_k8s kubelet)" --kubeconfig "$W/kubeconfig" --config "$W/kubelet/config.yaml" \
    --root-dir "$W/kubelet/root" --cert-dir "$W/kubelet/pki" --hostname-override "$NODE_NAME" \
    --node-ip "$NODE_IP" --v=2
  wait_for "kubelet$NODE_SUFFIX healthy" 120 alive_and "kubelet$NODE_SUFFIX" curl -sf --max-time 5 "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"
}

# Dies naming the listener that holds one of the node's ports, before a component fails to
# bind it. Listeners only: the components set SO_REUSEADDR, which binds over any other
# socket left on the port, except a client's, and a client gets one of these ports only
# from an ephemeral range that covers it (said below).
check_ports_free() {
  local port holder listeners
  for port in "${NODE_PORTS[@]}"; do
    listeners=$(ss -Htlnp "( sport = :$port )") || die "ss could not list the listeners on port $port"
    holder=$(sed -n 1p <<<"$listeners" | tr -s " ")
    [[ -z $holder ]] || die "port $port is taken, so the node cannot bind it: $holder"
  done
}

# Says which of the node's ports this host's ephemeral range covers: a socket given one
# first (a client's, or a listener's on port 0) would stop the component that binds it.
warn_ephemeral_ports() {
  local port low high
  read -r low high </proc/sys/net/ipv4/ip_local_port_range
  for port in "${NODE_PORTS[@]}"; do
    ((port < low || port > high)) ||
      say "port $port is in this host's ephemeral range ($low-$high): a connection may take it first"
  done
  return 0
}

node_ready() {
  [[ $(kubectl_ --request-timeout=10s get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

cmd_up() {
  local runtime=containerd2 api_only=false nodes=1
  while (($#)); do
    case $1 in
      --nodes)
        nodes=${2:-}
        shift 2 || die "--nodes takes 1 or 2"
        [[ $nodes == 1 || $nodes == 2 ]] || die "--nodes takes 1 or 2, not '$nodes'"
        ;;
      --api-only)
        api_only=true
        shift
        ;;
      --runtime)
        runtime=${2:-}
        shift 2 || die "--runtime takes containerd16 or containerd2"
        ;;
      --runtime=*)
        runtime=${1#*=}
        shift
        ;;
      --runtime-request-timeout)
        RUNTIME_REQUEST_TIMEOUT_SECONDS=${2:-}
        shift 2 || die "--runtime-request-timeout takes a number of seconds"
        [[ $RUNTIME_REQUEST_TIMEOUT_SECONDS =~ ^[1-9][0-9]*$ ]] ||
          die "--runtime-request-timeout takes a number of seconds, not '$RUNTIME_REQUEST_TIMEOUT_SECONDS'"
        ;;
      --terminated-pod-gc-threshold)
        TERMINATED_POD_GC_THRESHOLD=${2:-}
        shift 2 || die "--terminated-pod-gc-threshold takes a number of pods"
        [[ $TERMINATED_POD_GC_THRESHOLD =~ ^[1-9][0-9]*$ ]] ||
          die "--terminated-pod-gc-threshold takes a number of pods above 0, not '$TERMINATED_POD_GC_THRESHOLD'"
        ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [[ $runtime == containerd16 || $runtime == containerd2 ]] ||
    die "--runtime takes containerd16 or containerd2, not '$runtime'"
  [[ $nodes == 1 ]] || ! $api_only || die "--api-only runs no node: --nodes does not go with it"
  ((nodes == 1)) || NODE_PORTS+=("$NODE_B_KUBELET_PORT" "$NODE_B_KUBELET_HEALTHZ_PORT")
  K8S_VERSION=$(k8s_version "$runtime")
  need_root "scripts/node.sh up"
  # kubelet's cgroupfs layout here is cgroup v1's (these machines'); a unified-only host
  # would need the v2 layout.
  [[ ! -e /sys/fs/cgroup/cgroup.controllers ]] ||
    die "this host mounts only cgroup v2 at /sys/fs/cgroup; scripts/node.sh sets up kubelet for cgroup v1"
  # The node's own processes are kept in the pids hierarchy (NODE_CGROUP), so down finds them.
  [[ $(stat -fc %T /sys/fs/cgroup/pids 2>/dev/null) == cgroupfs ]] ||
    die "this host has no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids, where the node keeps its processes"
  [[ ! -e $W/run ]] || die "a node is already up in $W (bash scripts/node.sh down first)"
  if $api_only; then
    need_packages openssl curl
  else
    need_packages containerd runc catatonit containernetworking-plugins iproute2 iptables openssl curl
  fi
  # Before a build that can take minutes, and again after it.
  warn_ephemeral_ports
  check_ports_free
  if $api_only; then
    node_go_env
    build_kubernetes
    build_etcd
  else
    build_all "$runtime"
  fi
  check_ports_free
  local started=$SECONDS
  mkdir -p "$W/logs" "$W/run" "$W/etcd" "$W/pod-logs"
  echo "$runtime" >"$W/runtime"
  write_pki
  # The full node authorizes everything, as its components run with the admin token; the API
  # alone checks RBAC, so that a test sees what a ServiceAccount's role allows.
  local authorization=AlwaysAllow
  if $api_only; then
    authorization=RBAC
  else
    ((nodes == 1)) || make_node_b_namespace
    write_cni
    write_containerd_config "$runtime"
    write_kubelet_config
    # replace, not add: an address left by a node that was never taken down must not stop this one.
    ip addr replace "$NODE_IP/32" dev lo
    if ((nodes == 2)); then
      (
        select_node b
        write_cni
        write_containerd_config "$runtime"
        write_kubelet_config
        ip addr replace "$NODE_IP/32" dev lo
      )
    fi
  fi

  start etcd "$NODE_CACHE/bin/etcd-$ETCD_VERSION/etcd" --data-dir "$W/etcd" --name node \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "node=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync
  wait_for "etcd healthy" 60 alive_and etcd curl -sf --max-time 5 "http://127.0.0.1:$ETCD_PORT/health"

  start apiserver "$(bin_k8s kube-apiserver)" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --secure-port "$APISERVER_PORT" --advertise-address "$NODE_IP" \
    --tls-cert-file "$W/pki/apiserver.crt" --tls-private-key-file "$W/pki/apiserver.key" \
    --token-auth-file "$W/pki/tokens.csv" --authorization-mode "$authorization" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$W/pki/sa.pub" --service-account-signing-key-file "$W/pki/sa.key" \
    --service-cluster-ip-range "$SERVICE_RANGE" --allow-privileged=true --profiling=false \
    --kubelet-preferred-address-types InternalIP
  wait_for "kube-apiserver ready" 120 alive_and apiserver kubectl_ --request-timeout=10s get --raw /readyz
  if $api_only; then
    say "the API alone up in $((SECONDS - started)) s: kube-apiserver $K8S_VERSION"
    echo "NODE_DIR=$W"
    echo "PATH_KUBECTL=$(bin_k8s kubectl)"
    echo "APISERVER_PID_FILE=$W/run/apiserver.pid"
    echo "KUBECONFIG=$W/kubeconfig"
    return 0
  fi

  start controller-manager "$(bin_k8s kube-controller-manager)" --kubeconfig "$W/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$CONTROLLER_MANAGER_PORT" \
    --controllers statefulset-controller,daemonset-controller,garbage-collector-controller,pod-garbage-collector-controller,serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,namespace-controller,node-lifecycle-controller \
    --service-account-private-key-file "$W/pki/sa.key" --root-ca-file "$W/pki/ca.crt" \
    --use-service-account-credentials=false --profiling=false \
    --terminated-pod-gc-threshold "$TERMINATED_POD_GC_THRESHOLD"
  echo "$TERMINATED_POD_GC_THRESHOLD" >"$W/terminated-pod-gc-threshold"
  start scheduler "$(bin_k8s kube-scheduler)" --kubeconfig "$W/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --profiling=false

  start_containerd
  local pause_archive
  pause_archive=$(pause_image_archive)
  ctr_ images import --snapshotter overlayfs "$pause_archive" >/dev/null
  say "imported the pause image $PAUSE_IMAGE"
  start_kubelet
  if ((nodes == 2)); then
    (
      select_node b
      start_containerd
      ctr_ images import --snapshotter overlayfs "$pause_archive" >/dev/null
      say "imported the pause image $PAUSE_IMAGE on node b"
      start_kubelet
    )
  fi
  wait_for "node $NODE_NAME Ready" 180 node_ready
  if ((nodes == 2)); then
    (
      select_node b
      wait_for "node $NODE_NAME Ready" 180 node_ready
    )
  fi
  wait_for "the default service account" 60 kubectl_ --request-timeout=10s get serviceaccount default
  local node_b=''
  ((nodes == 1)) || node_b=" and node b ($NODE_B_DIR, bash scripts/node.sh --node b env)"
  say "up in $((SECONDS - started)) s: $runtime, kubelet $K8S_VERSION$node_b; the guard is not installed"
  cmd_env
}

# The node's paths as the host sees them (node b's under NODE_B_DIR); with two nodes up, also
# what tells them apart, and the IPAM dir they share.
cmd_env() {
  [[ -e $W/kubeconfig ]] || die "no node is up in $W"
  local h=$NODE_HOST_DIR
  echo "RUNTIME=$(runtime_of_node)"
  echo "CONTAINERD_SOCKET=$h/containerd/containerd.sock"
  echo "CNI_BIN_DIR=$h/cni/bin"
  echo "CNI_CONF_DIR=$h/cni/net.d"
  echo "PRIMARY_STATE=$h/cni/primary"
  echo "GUARD_STATE=$h/guard/state"
  echo "GUARD_LOG=$h/guard/log/sandbox-guard.log"
  echo "NODE_DIR=$W"
  if two_nodes; then
    echo "NODE_NAME=$NODE_NAME"
    echo "NODE_IP=$NODE_IP"
    echo "POD_SUBNET=$POD_SUBNET"
    echo "IPAM_DIR=$IPAM_DIR"
    [[ $NODE == a ]] || echo "NODE_MOUNT_NS=$NODE_B_MOUNT_NS"
  fi
  echo "KUBELET_METRICS=https://$NODE_IP:$KUBELET_PORT/metrics"
  echo "PATH_KUBECTL=$(bin_k8s kubectl)"
  echo "PATH_CRICTL=$NODE_CACHE/bin/cri-tools-$CRITOOLS_VERSION/crictl"
  echo "PATH_CTR=$(containerd_bin_dir "$(runtime_of_node)")/ctr"
  echo "PAUSE_IMAGE=$PAUSE_IMAGE"
  echo "RUNTIME_REQUEST_TIMEOUT_SECONDS=$(sed -n 's/^runtimeRequestTimeout: \([0-9]*\)s$/\1/p' "$h/kubelet/config.yaml")"
  echo "TERMINATED_POD_GC_THRESHOLD=$(cat "$W/terminated-pod-gc-threshold")"
  echo "KUBECONFIG=$W/kubeconfig"
}

cmd_restart() {
  [[ -e $W/run ]] || die "no node is up in $W"
  case ${1:-} in
    kubelet)
      stop "kubelet$NODE_SUFFIX"
      start_kubelet
      ;;
    containerd)
      # Shims and containers live on, as when a node's containerd restarts. --kill: SIGKILL,
      # as the OOM killer or a crash ends it, with no chance to cancel the calls it runs
      # (the CNI plugins it exec'd run on).
      local signal=TERM
      [[ ${2:-} == --kill ]] && signal=KILL
      stop "containerd$NODE_SUFFIX" "$signal"
      start_containerd
      ;;
    *) die "restart takes kubelet or containerd [--kill]" ;;
  esac
}

# stop kubelet, start kubelet: a node whose kubelet stopped answering (its containers run
# on under containerd), and the kubelet back later, which then tears down what the API no
# longer has for it.
cmd_stop_start() {
  [[ -e $W/run ]] || die "no node is up in $W"
  [[ ${2:-} == kubelet ]] || die "$1 takes kubelet"
  case $1 in
    stop) stop "kubelet$NODE_SUFFIX" ;;
    start) start_kubelet ;;
  esac
}

# kustomize takes a base by a relative path only.
relative_to() { # TARGET FROM
  local from=$2 up=''
  while [[ $from != / ]]; do
    up+=../
    from=$(dirname "$from")
  done
  echo "$up${1#/}"
}

# arg_index MANIFEST-DIR PREFIX: the index of the installer's arg that starts with PREFIX.
arg_index() {
  "$(bin_k8s kubectl)" kustomize "$1" |
    awk -v p="$2" '/^ *- args:/ {on=1; i=0; next} on && /^ *- / {if (index($2, p) == 1) {print i; exit} i++; next} on {exit}'
}

# write_overlay DIR BASE DAEMONSET IMAGE [ARG...]: a kustomize overlay of the project's
# manifests for this node, as an operator of a node with its own dirs writes one: the image
# (imported, never pulled), the node's CNI bin and conf dirs, the guard's state and log under
# the work dir (so that down leaves nothing on the host), and each ARG (--name=value) put in
# place of the installer's arg of that name; each arg of OVERLAY_ADD_ARGS (an array) is added.
write_overlay() {
  local dir=$1 base=$2 daemonset=$3 image=$4 arg index
  shift 4
  mkdir -p "$dir" "$W/guard/log"
  cat >"$dir/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(relative_to "$base" "$dir")
images:
  - name: registry.example.com/sandbox-guard
    newName: ${image%:*}
    newTag: ${image##*:}
  - name: registry.k8s.io/pause
    newName: ${PAUSE_IMAGE%:*}
    newTag: ${PAUSE_IMAGE##*:}
patches:
  - path: node.yaml
YAML
  if (($# + ${#OVERLAY_ADD_ARGS[@]})); then
    printf '  - target: { kind: DaemonSet, name: %s }\n    patch: |-\n' "$daemonset" >>"$dir/kustomization.yaml"
    for arg in "$@"; do
      index=$(arg_index "$base" "${arg%%=*}=")
      [[ -n $index ]] || die "the DaemonSet $daemonset has no ${arg%%=*} arg to set"
      printf '      - { op: replace, path: /spec/template/spec/containers/0/args/%s, value: "%s" }\n' \
        "$index" "$arg" >>"$dir/kustomization.yaml"
    done
    # Single-quoted YAML: an arg may hold JSON's double quotes (never a single quote here).
    for arg in "${OVERLAY_ADD_ARGS[@]}"; do
      printf "      - { op: add, path: /spec/template/spec/containers/0/args/-, value: '%s' }\n" \
        "$arg" >>"$dir/kustomization.yaml"
    done
  fi
  # The installer reads the state dir at the host root it is given plus the entry's path.
  local containers=containers container=install
  [[ $daemonset == sandbox-guard-uninstall ]] && containers=initContainers container=uninstall
  cat >"$dir/node.yaml" <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: { name: $daemonset, namespace: kube-system }
spec:
  template:
    spec:
      $containers:
        - name: $container
          volumeMounts:
            - { name: cni-state, mountPath: /host$W/guard, readOnly: true }
$(if [[ $daemonset == sandbox-guard ]]; then
  # containerd names its dirs as the host sees them: the probe finds them under /host.
  echo "            - { name: cni-bin, mountPath: /host$W/cni/bin, readOnly: $OVERLAY_CNI_READ_ONLY }"
  echo "            - { name: cni-conf, mountPath: /host$W/cni/net.d, readOnly: $OVERLAY_CNI_READ_ONLY }"
fi)
      volumes:
$(if [[ $daemonset == sandbox-guard ]]; then
  # The node's containerd socket, where the probe looks for containerd's.
  echo "        - { name: runtime-socket, hostPath: { path: $W/containerd, type: DirectoryOrCreate } }"
fi)
        - { name: cni-bin, hostPath: { path: $W/cni/bin, type: DirectoryOrCreate } }
        - { name: cni-conf, hostPath: { path: $W/cni/net.d, type: DirectoryOrCreate } }
        - { name: cni-state, hostPath: { path: $W/guard, type: DirectoryOrCreate } }
        - { name: logs, hostPath: { path: $W/guard/log, type: DirectoryOrCreate } }
YAML
}

cmd_guard() {
  [[ -e $W/run ]] || die "no node is up in $W"
  node_go_env
  local action=${1:-} mode image
  case $action in
    install)
      mode=${2:-}
      image=${3:-}
      [[ ($mode == delegate || $mode == chained) && -n $image ]] ||
        die "guard install takes delegate|chained and an image imported into the node"
      case ${4:-} in
        '') ;;
        --api-view)
          # The API server's view on, as the manifest's commented-out args turn it on. The
          # host reaches no Service address here (no kube-proxy): the API server's own, which
          # its certificate names. The model primary keys its IPAM handle by pod name across
          # the cluster (calico 2.1), hence podKeyScope "cluster". The conf dir as the host
          # names it (under /host, where the overlay mounts it): the entry names the kubeconfig
          # by it, and the base's /etc/cni/net.d is another dir on this host. containerd then
          # answers for that conf dir, and the binaries go into the bin dir it names: both
          # mounts writable.
          # shellcheck disable=SC2016 # $(NODE_NAME) is kubelet's to expand, from the pod's env.
          OVERLAY_ADD_ARGS=(--api-credentials=/var/run/secrets/sandbox-guard
            '--node-name=$(NODE_NAME)' "--api-server=https://127.0.0.1:$APISERVER_PORT"
            '--entry={"podKeyScope":"cluster"}' "--conf-dir=/host$W/cni/net.d")
          OVERLAY_CNI_READ_ONLY=false
          ;;
        *) die "guard install takes --api-view after the image, or nothing" ;;
      esac
      write_overlay "$W/overlay-guard" "$repo/conf-examples/kubernetes" sandbox-guard "$image" \
        --mode="$mode" --state-dir="$GUARD_STATE" --log-file="$W/guard/log/sandbox-guard.log"
      kubectl_ apply -k "$W/overlay-guard" >&2
      kubectl_ -n kube-system rollout status ds/sandbox-guard --timeout=180s >&2
      ;;
    uninstall)
      image=${2:-}
      [[ -n $image ]] || die "guard uninstall takes the image imported into the node"
      kubectl_ -n kube-system delete ds/sandbox-guard --ignore-not-found --wait=true >&2
      write_overlay "$W/overlay-uninstall" "$repo/conf-examples/kubernetes/uninstall" \
        sandbox-guard-uninstall "$image"
      kubectl_ apply -k "$W/overlay-uninstall" >&2
      kubectl_ -n kube-system rollout status ds/sandbox-guard-uninstall --timeout=180s >&2
      kubectl_ delete -k "$W/overlay-uninstall" --wait=true >&2
      ;;
    *) die "guard takes install or uninstall" ;;
  esac
}

# The NetworkAttachmentDefinition CRD, read from multus's module source (the first document
# of its DaemonSet manifest), never committed.
multus_crd() {
  local dir
  dir=$(module_dir "gopkg.in/k8snetworkplumbingwg/multus-cni.v4@v$MULTUS_VERSION") || exit 1
  [[ -f $dir/deployments/multus-daemonset.yml ]] ||
    die "the Go module proxy did not serve multus-cni.v4@v$MULTUS_VERSION's source"
  awk 'BEGIN {RS = "\n---\n"} /kind: CustomResourceDefinition/ {print; exit}' "$dir/deployments/multus-daemonset.yml"
}

# in_cluster_wrapper: the command words that run a host process finding the API server as a
# pod does (multus's daemon and thin entrypoint know no other way): the service account's
# files and the KUBERNETES_SERVICE_* variables, the files on a /run of its own mount
# namespace, which still sees every netns containerd mounts later (slave propagation).
in_cluster_wrapper() {
  local sa=$W/multus/serviceaccount
  mkdir -p "$sa"
  printf '%s' "$TOKEN" >"$sa/token"
  cp "$W/pki/ca.crt" "$sa/ca.crt"
  printf kube-system >"$sa/namespace"
  chmod 600 "$sa/token"
  IN_CLUSTER=(unshare --mount --propagation slave -- /bin/sh -c '
    mount -t tmpfs -o mode=0755,size=1m tmpfs /run &&
    mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
    mount --bind "$1" /run/secrets/kubernetes.io/serviceaccount &&
    port=$0 && shift && exec env KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT="$port" "$@"'
    "$APISERVER_PORT" "$sa")
}

multus_conf_written() { compgen -G "$W/cni/net.d/00-multus.conf*" >/dev/null; }

# Multus v4 as its two DaemonSets put it on a node, as host processes (no registry for its
# images): thin, the thin entrypoint copying the multus binary into the bin dir and writing
# 00-multus.conf(list) with the node's network inlined as its delegate, re-inlined whenever
# that file changes; thick, multus-shim in the bin dir and multus-daemon writing
# 00-multus.conf (type multus-shim, clusterNetwork the primary's file) and running the
# delegates itself.
cmd_multus() {
  [[ -e $W/run ]] || die "no node is up in $W"
  node_go_env
  local bins=$NODE_CACHE/bin/multus-$MULTUS_VERSION
  case ${1:-} in
    install)
      [[ ${2:-} == thin || ${2:-} == thick ]] || die "multus install takes thin or thick"
      [[ ! -e $W/run/multus.pid ]] || die "multus is already installed (bash scripts/node.sh multus remove)"
      build_multus
      multus_crd | kubectl_ apply -f - >&2
      mkdir -p "$W/multus/net.d" "$W/multus/cache" "$W/multus/run"
      # The daemon enters each pod's netns by its path: containerd mounts it later, and this
      # host's / is a private mount, so the dir is made a shared mount for the daemon's own
      # mount namespace to receive them (down unmounts everything under the work dir).
      local netns_dir=$W/containerd/state/io.containerd.grpc.v1.cri/netns
      mkdir -p "$netns_dir"
      mountpoint -q "$netns_dir" || mount --rbind "$netns_dir" "$netns_dir"
      mount --make-rshared "$netns_dir"
      in_cluster_wrapper
      case $2 in
        thin)
          start multus "${IN_CLUSTER[@]}" "$bins/thin_entrypoint" --cni-bin-dir "$W/cni/bin" \
            --cni-conf-dir "$W/cni/net.d" --multus-bin-file "$bins/multus" \
            --multus-cni-conf-dir "$W/multus/net.d" --multus-autoconfig-dir "$W/cni/net.d" \
            --multus-kubeconfig-file-host "$W/cni/net.d/multus.d/multus.kubeconfig" \
            --multus-conf-file auto --multus-log-level verbose --cleanup-config-on-exit
          ;;
        thick)
          cp "$bins/multus-shim" "$W/cni/bin/multus-shim"
          # Upstream's daemon-config.json, with this node's dirs and no chroot (a host process).
          cat >"$W/multus/daemon-config.json" <<EOF
{
    "cniVersion": "0.3.1",
    "logLevel": "verbose",
    "logToStderr": true,
    "cniConfigDir": "$W/cni/net.d",
    "multusAutoconfigDir": "$W/cni/net.d",
    "multusConfigFile": "auto",
    "binDir": "$W/cni/bin",
    "cniDir": "$W/multus/cache",
    "socketDir": "$W/multus/run",
    "daemonSocketDir": "$W/multus/run"
}
EOF
          start multus "${IN_CLUSTER[@]}" env MULTUS_NODE_NAME="$NODE_NAME" "$bins/multus-daemon" -config "$W/multus/daemon-config.json"
          ;;
      esac
      wait_for "multus ($2) writing 00-multus.conf" 60 alive_and multus multus_conf_written
      ;;
    remove)
      stop multus
      rm -f "$W/cni/net.d/00-multus.conf" "$W/cni/net.d/00-multus.conflist" "$W/cni/bin/multus" \
        "$W/cni/bin/multus-shim"
      rm -rf "$W/cni/net.d/multus.d"
      ;;
    *) die "multus takes install thin|thick or remove" ;;
  esac
}

# The processes the node started: those in its cgroup and in kubelet's pods', in any hierarchy.
node_pids() {
  find /sys/fs/cgroup/*/"${CGROUP_ROOT#/}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u
}

cmd_down() {
  need_root "scripts/node.sh down"
  [[ -e $W ]] || {
    say "no node in $W: nothing to do"
    return 0
  }
  say "stopping the node in $W"
  # Node b's dirs as the host sees them, if it was up; its processes, in the cgroups of node
  # a's root, go with node a's, and its mount namespace, with all its mounts and the netns
  # its containerd pinned there, once no process is left in it and its file is unmounted.
  local node_dirs=("$W") node_b_ns=''
  [[ ! -d $NODE_B_DIR ]] || node_dirs+=("$NODE_B_DIR")
  # The namespace's inode, to tell afterwards whether a process outside the node's cgroups (an
  # operator's nsenter shell) still holds it, and with it the mounts and netns made there.
  [[ ! -e $NODE_B_MOUNT_NS ]] || node_b_ns=$(stat -c %i "$NODE_B_MOUNT_NS" 2>/dev/null) || true
  stop kubelet
  stop kubelet-b
  # Containers first, while runc still knows them; then their shims and containerd.
  local id dir
  for dir in "${node_dirs[@]}"; do
    [[ -d $dir/containerd/runc/k8s.io ]] || continue
    for id in $(runc --root "$dir/containerd/runc/k8s.io" list -q 2>/dev/null); do
      runc --root "$dir/containerd/runc/k8s.io" kill "$id" KILL 2>/dev/null || true
      runc --root "$dir/containerd/runc/k8s.io" delete --force "$id" 2>/dev/null || true
    done
  done
  # The ids of every task and sandbox the node had (the bundles left, and each sandbox the
  # primary was asked to ADD): their shims' sockets and loopback results live outside $W.
  local shim_ids=()
  mapfile -t shim_ids < <(for dir in "${node_dirs[@]}"; do
    ls "$dir/containerd/state/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null
    awk '$2 == "ADD" {print $3}' "$dir/cni/primary/calls.log" 2>/dev/null
  done | grep -E '^[0-9a-f]{64}$' | sort -u)
  stop containerd
  stop containerd-b
  for name in multus scheduler controller-manager apiserver etcd; do stop "$name"; done
  # What they left running (shims, a primary's children, what runc no longer knew), until none
  # is left: a process forked between a read and the kill is caught at the next round. A
  # killed process leaves its cgroup a moment later.
  local pids
  for _ in $(seq 50); do
    pids=$(node_pids)
    [[ -n $pids ]] || break
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  local mount round
  for round in 1 2 3 4 5; do
    mapfile -t mounts < <(awk -v w="$W/" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    ((${#mounts[@]})) || break
    for mount in "${mounts[@]}"; do umount --lazy "$mount" 2>/dev/null || true; done
  done
  local link
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$VETH_PREFIX" || true); do
    ip link delete "$link" 2>/dev/null || true
  done
  ip addr del "$NODE_IP/32" dev lo 2>/dev/null || true
  ip addr del "$NODE_B_IP/32" dev lo 2>/dev/null || true
  # Cgroups kubelet and start made under the root, deepest first, now that they are empty.
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/; do
    [[ -d $hierarchy${CGROUP_ROOT#/} ]] || continue
    find "$hierarchy${CGROUP_ROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  # Chains kubelet adds (kubelet_network_linux.go: its canary, the iptables-mode hint, and
  # KUBE-FIREWALL with jumps to it from INPUT and OUTPUT, which must go before the chain can).
  local tool table chain
  for tool in iptables ip6tables; do
    command -v "$tool" >/dev/null || continue
    for chain in INPUT OUTPUT; do
      while "$tool" -w -t filter -D "$chain" -j KUBE-FIREWALL 2>/dev/null; do :; done
    done
    for table in mangle nat filter; do
      for chain in KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT KUBE-FIREWALL; do
        "$tool" -w -t "$table" -F "$chain" 2>/dev/null && "$tool" -w -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
  # What the node leaves outside its work dir, whatever the configs say: libcni's result cache
  # (the node's network and containerd's own cni-loopback), kubelet's container log links
  # (/var/log/containers is a constant in kubelet) and device-plugin socket, the shims'
  # sockets (sha256 of "<containerd socket>/<namespace>/<id>[/debug]", pkg/shim).
  local id link hash suffix
  for id in "${shim_ids[@]}"; do
    rm -f /var/lib/cni/results/cni-loopback-"$id"-* 2>/dev/null || true
    for suffix in '' /debug; do
      hash=$(printf '%s' "$W/containerd/containerd.sock/k8s.io/$id$suffix" | sha256sum | cut -d' ' -f1)
      rm -f "/run/containerd/s/$hash"
    done
  done
  rm -f /var/lib/cni/results/"$NETWORK_NAME"-* /var/lib/cni/results/multus-cni-network-* 2>/dev/null || true
  # Multus thin's cache of each sandbox's delegates and their libcni results (its conf names
  # no cniDir, so they go to multus's default).
  for id in "${shim_ids[@]}"; do
    rm -f /var/lib/cni/multus/"$id" /var/lib/cni/multus/results/*-"$id"-* 2>/dev/null || true
  done
  rmdir /var/lib/cni/multus/results /var/lib/cni/multus 2>/dev/null || true
  for link in /var/log/containers/*.log; do
    if [[ -L $link && $(readlink "$link") == "$W/"* ]]; then rm -f "$link"; fi
  done
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet /run/containerd/s /run/containerd 2>/dev/null || true
  rm -rf "$W"
  # Say what is left rather than claim nothing is.
  local left=()
  [[ -z $(node_pids) ]] || left+=("processes in the cgroups $CGROUP_ROOT")
  if awk -v w="$W/" 'index($5, w) == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
    left+=("mounts under $W")
  fi
  if ip -o link show | awk -F': ' '{print $2}' | grep -q "^$VETH_PREFIX"; then
    left+=("links $VETH_PREFIX*")
  fi
  if compgen -G "/sys/fs/cgroup/*/${CGROUP_ROOT#/}" >/dev/null; then
    left+=("cgroups $CGROUP_ROOT")
  fi
  local ns
  if [[ -n $node_b_ns ]]; then
    for ns in /proc/[0-9]*/ns/mnt; do
      if [[ $(readlink "$ns" 2>/dev/null) == "mnt:[$node_b_ns]" ]]; then
        left+=("processes in node b's mount namespace, which keeps its mounts (${ns%/ns/mnt})")
        break
      fi
    done
  fi
  if ((${#left[@]})); then
    say "down: left behind: ${left[*]}"
    return 1
  fi
  say "down: nothing of the node is left"
}

need_node_bins() {
  node_go_env
  [[ -x $(bin_k8s kubectl) ]] || die "the node's components are not built (bash scripts/node.sh build)"
}

# --node b, before the command: env, restart, crictl and ctr act on node b.
case ${1:-} in
  --node | --node=*)
    if [[ $1 == --node ]]; then
      node=${2:-}
      shift 2 || die "--node takes a or b"
    else
      node=${1#*=}
      shift
    fi
    select_node "$node"
    if [[ $NODE == b ]]; then
      [[ ${1:-} == env || ${1:-} == restart || ${1:-} == stop || ${1:-} == start || ${1:-} == crictl || ${1:-} == ctr ]] ||
        die "--node b goes with env, restart, stop, start, crictl or ctr, not '${1:-}'"
      [[ -e $NODE_B_MOUNT_NS ]] || die "node b is not up in $W (bash scripts/node.sh up --nodes 2)"
    fi
    ;;
esac

case ${1:-} in
  up)
    shift
    cmd_up "$@"
    ;;
  down) cmd_down ;;
  build)
    shift
    runtime=containerd2
    [[ ${1:-} == --runtime ]] && runtime=${2:-containerd2}
    [[ ${1:-} == --runtime=* ]] && runtime=${1#*=}
    K8S_VERSION=$(k8s_version "$runtime")
    build_all "$runtime"
    ;;
  restart)
    shift
    cmd_restart "$@"
    ;;
  stop | start) cmd_stop_start "$@" ;;
  env) cmd_env ;;
  guard)
    shift
    cmd_guard "$@"
    ;;
  multus)
    shift
    cmd_multus "$@"
    ;;
  primary)
    [[ -e $W/run ]] || die "no node is up in $W"
    case ${2:-} in
      bridge) write_bridge_conflist ;;
      model) write_cni ;;
      cilium-chained) write_cilium_chained_conflist ;;
      *) die "primary takes bridge, model or cilium-chained" ;;
    esac
    ;;
  kubectl)
    shift
    need_node_bins
    kubectl_ "$@"
    ;;
  crictl)
    shift
    need_node_bins
    crictl_ "$@"
    ;;
  ctr)
    shift
    ctr_ "$@"
    ;;
  *) die "usage: scripts/node.sh [--node a|b] up [--runtime containerd16|containerd2] [--nodes 2] | down | build | restart kubelet|containerd [--kill] | stop|start kubelet | guard install|uninstall ... | multus install thin|thick | multus remove | primary bridge|model|cilium-chained | env | kubectl ... | crictl ... | ctr ..." ;;
esac
