# Sourced by scripts/node.sh: builds the real node's components from their Go modules (the
# Go module proxy, the go command only; nothing prebuilt is downloaded and nothing upstream is
# committed or patched), cached between runs under $NODE_CACHE: the module cache, the build
# cache and the binaries, one directory per component and version.
#
# Pins (the newest that runs on these machines: cgroup v1, no CAP_SYS_RESOURCE), Kubernetes
# per runtime, since a node's kubelet goes with its runtime:
#   containerd 2.2 runs Kubernetes 1.37, the newest released minor (1.38 is in beta); it
#   needs failCgroupV1: false here, which the node's config sets, and Go 1.26.
#   containerd 1.6 keeps Kubernetes 1.34 by policy, not for want of a newer kubelet that runs
#   (1.37 still falls back to the configured cgroup driver when RuntimeConfig is missing):
#   SIG Node supports containerd 1.x up to 1.35 (the v1.35 release blog,
#   kubernetes/website#53498), so no supported 1.6 node runs a newer kubelet, and 1.34 is the
#   one these tests have run against since they began.
#   etcd 3.6 serves both API servers; containerd 2.2 is the newest 2.x line whose CRI
#   accepts both kubelets' calls as 2.x does on nodes; cri-tools 1.34 speaks CRI v1 to
#   either runtime.
# SANDBOX_GUARD_K8S_VERSION sets one version for both.
CONTAINERD2_K8S_VERSION=1.37.2
CONTAINERD16_K8S_VERSION=1.34.4
k8s_version() {
  case $1 in
    containerd16) echo "${SANDBOX_GUARD_K8S_VERSION:-$CONTAINERD16_K8S_VERSION}" ;;
    *) echo "${SANDBOX_GUARD_K8S_VERSION:-$CONTAINERD2_K8S_VERSION}" ;;
  esac
}
ETCD_VERSION=3.6.16
CONTAINERD2_VERSION=2.2.9
CRITOOLS_VERSION=1.34.0
MULTUS_VERSION=4.2.3
NODE_CACHE=${SANDBOX_GUARD_NODE_CACHE:-/var/cache/sg-node}

node_go_env() {
  export GOMODCACHE=$NODE_CACHE/gomod GOCACHE=$NODE_CACHE/gocache GOFLAGS=-mod=mod
  export GOTOOLCHAIN=local GO111MODULE=on
  unset GOPATH GOBIN
  # Go's own archive installs to /usr/local/go, which a PATH may not name or may name after
  # Debian's older golang-go (the libcni tests install that one).
  [[ -x /usr/local/go/bin/go ]] && PATH=/usr/local/go/bin:$PATH
  local version
  version=$(go env GOVERSION 2>/dev/null) || version=''
  version=${version#go}
  if [[ -z $version ]] || ! printf '1.26\n%s\n' "${version%%[-+ ]*}" | sort -C -V; then
    echo "the node's components are built from their Go modules with Go >= 1.26 (Kubernetes 1.37's go.mod);" \
      "found ${version:-no go command} (Debian's golang-go is older: install Go from go.dev's archive)" >&2
    return 1
  fi
  # The module proxy only: a module it does not serve fails the build here instead of being
  # cloned from its repository (go's default list ends in "direct").
  local proxy
  proxy=$(go env GOPROXY)
  proxy=${proxy%[,|]direct}
  [[ -n $proxy && $proxy != direct ]] || proxy=https://proxy.golang.org
  export GOPROXY=$proxy
}

# module_dir MODULE@VERSION: the module's source dir in the module cache, downloaded from the
# proxy if it is not there. go mod download puts its error only in the JSON on stdout: said
# here, after a second try, since a proxy's error is often passing.
module_dir() {
  local json try
  for try in 1 2; do
    if json=$(cd /tmp && go mod download -json "$1"); then
      sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$json"
      return 0
    fi
    echo "node: the Go module proxy did not serve $1 (try $try of 2): $(sed -n 's/^\t"Error": //p' <<<"$json")" >&2
    ((try == 2)) || sleep 5
  done
  return 1
}

# go_wrapper_build NAME DIR GO.MOD-TEXT PACKAGE...: builds PACKAGEs into $NODE_CACHE/bin/NAME
# from a wrapper module whose go.mod is the given text; a stamp names what was built, so a
# second run does nothing.
go_wrapper_build() {
  local name=$1 gomod=$2
  shift 2
  local out=$NODE_CACHE/bin/$name src=$NODE_CACHE/src/$name
  local stamp="$gomod"$'\n'"$*"
  if [[ -f $out/.stamp && $(<"$out/.stamp") == "$stamp" ]]; then
    return 0
  fi
  mkdir -p "$src" "$out"
  printf '%s\n' "$gomod" >"$src/go.mod"
  echo "node: building $name from the Go module proxy (first time: several minutes)" >&2
  local started=$SECONDS
  # Progress while the go command is silent: a line a minute. Its sleep goes with it, or
  # the sleep would hold the caller's pipes open for up to a minute.
  (
    sleeper=''
    trap 'kill $sleeper 2>/dev/null; exit 0' TERM
    while sleep 60 & sleeper=$!; wait "$sleeper"; do
      echo "node: still building $name ($((SECONDS - started)) s)" >&2
    done
  ) &
  local ticker=$!
  local status=0 try
  # A second try for a proxy's passing error; what was downloaded stays in the cache.
  for try in 1 2; do
    status=0
    (cd "$src" && go build -o "$out/" "$@") || status=$?
    [[ $status != 0 && $try == 1 ]] || break
    echo "node: building $name failed (go build in $src); trying once more" >&2
    sleep 5
  done
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [[ $status != 0 ]]; then
    echo "node: building $name failed twice (go build in $src)" >&2
    return 1
  fi
  printf '%s' "$stamp" >"$out/.stamp"
  echo "node: built $name in $((SECONDS - started)) s" >&2
}

# k8s.io/kubernetes pins its staging modules (k8s.io/api, client-go, ...) to v0.0.0 and
# replaces them with paths inside its own tree, which a module that requires it cannot see:
# the wrapper replaces each with its published v0.X.Y, the list read from the pinned go.mod.
build_kubernetes() {
  local v=$K8S_VERSION dir
  dir=$(module_dir "k8s.io/kubernetes@v$v") || return 1
  if [[ ! -f $dir/go.mod ]]; then
    echo "node: the Go module proxy did not serve k8s.io/kubernetes@v$v" >&2
    return 1
  fi
  local replaces
  replaces=$(awk -v v="v0.${v#1.}" '$2 == "=>" && $3 ~ /^\.\/staging\// {print "\t" $1 " => " $1 " " v}' "$dir/go.mod")
  go_wrapper_build "kubernetes-$v" "module sandbox-guard.test/node/kubernetes

go 1.24.0

require k8s.io/kubernetes v$v

replace (
$replaces
)" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl
}

build_etcd() {
  go_wrapper_build "etcd-$ETCD_VERSION" "module sandbox-guard.test/node/etcd

go 1.24.0

require go.etcd.io/etcd/server/v3 v$ETCD_VERSION" go.etcd.io/etcd/server/v3
  # The server module's main package builds as `server`, the last element before /v3.
  [[ -x $NODE_CACHE/bin/etcd-$ETCD_VERSION/etcd ]] ||
    ln -sf server "$NODE_CACHE/bin/etcd-$ETCD_VERSION/etcd"
}

build_crictl() {
  go_wrapper_build "cri-tools-$CRITOOLS_VERSION" "module sandbox-guard.test/node/critools

go 1.24.0

require sigs.k8s.io/cri-tools v$CRITOOLS_VERSION" sigs.k8s.io/cri-tools/cmd/crictl
}

build_containerd2() {
  go_wrapper_build "containerd-$CONTAINERD2_VERSION" "module sandbox-guard.test/node/containerd

go 1.24.0

require github.com/containerd/containerd/v2 v$CONTAINERD2_VERSION" \
    -tags no_btrfs github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
}

# Multus v4 as upstream ships it: thin (cmd/multus, the delegating plugin itself, and
# cmd/thin_entrypoint, which its DaemonSet runs to write 00-multus.conf(list) and re-inline
# the primary's file whenever it changes) and thick (cmd/multus-daemon, which runs the
# delegates, and cmd/multus-shim, the plugin the runtime execs and that forwards to the
# daemon's socket). Its module installs as it is.
build_multus() {
  go_wrapper_build "multus-$MULTUS_VERSION" "module sandbox-guard.test/node/multus

go 1.24.0

require gopkg.in/k8snetworkplumbingwg/multus-cni.v4 v$MULTUS_VERSION" \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/thin_entrypoint \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim
}
