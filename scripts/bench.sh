#!/usr/bin/env bash
# Per-execution latency and peak memory of sandbox-guard, side by side with Debian's Go reference plugin
# `tuning`, in one run (the machines are shared and noisy: only numbers taken together compare); then
# delegate mode's own cost: one primary run alone, chained with the guard last, and wrapped by the guard
# (and by the baseline binary, when one is given). Where the plugin asks the API server (a kubeconfig in its
# entry), an ADD and a DEL that ask and the operator's binary's GET alone, against a local TLS stand-in.
#
#   sudo bash scripts/bench.sh [--quick] [--rounds N]
#
# Needs root (network namespace, state under /var/lib). Builds the release binary, installs missing Debian
# packages, prints PASS/FAIL per target and a markdown table for docs/benchmarks.md. Exit status: 0 when every
# target passes, 1 when one fails, 2 when the benchmark itself could not run.
#
# The speed targets are against the floor, measured in the same run: a static no-op C program for the exec
# (linked against musl, as the plugin is; the same no-op linked against glibc is reported beside it), and a
# static C program that makes one durable commit (about 700 bytes to a temp file, fdatasync, rename
# into place, fsync of the directory). ADD and DEL are reported as multiples of one commit, both above the
# exec, with the state on journaled ext4 and XFS made on loop-mounted image files and on BENCH_BASE_DIR's
# own file system, FLOOR_ROUNDS (300) rounds in a random order, medians; ADD at most 1.5x and DEL at most
# 1.3x the no-op's exec on each of them. Reported beside them, not checked: ADD's kernel work (a static
# C program making ADD's system calls with none of its parsing), the plugin's own exec (VERSION), and
# tuning's rows (tuning is a Go exec, not a floor). --rounds N sets FLOOR_ROUNDS; --quick runs every
# phase with few rounds and a small store (a few minutes) and skips delegate mode's cost.
#
# Knobs (environment): ITERATIONS (400) timed rounds of each phase, WARMUP (20) discarded rounds,
# LARGE_RECORDS (10000), SMALL_RECORDS (10), DUMP_RUNS (7), RSS_RUNS (5), BENCH_BASE_DIR (/var/lib) where
# the state dirs live, BURST (150) ADDs of new pods in a row, BURST_RUNS (7) bursts of each, FLOOR_ROUNDS (300)
# rounds of the floor comparison, loop-mounted file systems BENCH_FILESYSTEMS ("ext4 xfs"; empty: none, and
# then only BENCH_BASE_DIR's), DELEGATE_COST (1; 0 skips that phase), SANDBOX_GUARD_BIN to benchmark an already built binary instead of building one,
# BASELINE_BIN (or BASELINE_REF, a git ref built into its own checkout and target dir) an earlier binary timed
# beside this one in the same rounds: its ADD and DEL, and `--restore` of RESTORE_PODS (50) dual-stack macvlan
# pods RESTORE_RUNS (5) times each, alternating at random; HUNG_ENTRIES (50) hung deferred DELs beside which
# HUNG_ROUNDS (30) unrelated pods' ADD, CHECK, DEL and STATUS are timed;
# GUARD_KEYS extra keys of the guard's entry (JSON members with a leading comma; @WORK@ stands for the
# run's work dir, e.g. ',"metricsFile":"@WORK@/sg.prom"') to measure what a key costs against a run
# without it.
#
# Why a bash loop on $EPOCHREALTIME rather than hyperfine: hyperfine runs one case after the other, so on a
# machine shared with compilers a burst of load lands on one case and skews the ratios; it also cannot give
# each ADD/DEL a fresh container ID without wrapping the command in a shell, whose cost it then estimates and
# subtracts (more noise than the differences measured). Here every round runs every case, in a random order,
# with no process but the plugin forked per sample; the spawn baseline (/bin/true through the same path) shows
# the fixed cost that every row includes.
set -euo pipefail
export LC_ALL=C # $EPOCHREALTIME's decimal separator follows the locale

ITERATIONS=${ITERATIONS:-400}
WARMUP=${WARMUP:-20}
LARGE_RECORDS=${LARGE_RECORDS:-10000}
SMALL_RECORDS=${SMALL_RECORDS:-10}
DUMP_RUNS=${DUMP_RUNS:-7}
RSS_RUNS=${RSS_RUNS:-5}
BENCH_BASE_DIR=${BENCH_BASE_DIR:-/var/lib}
BURST=${BURST:-150}
BURST_RUNS=${BURST_RUNS:-7}
FLOOR_ROUNDS=${FLOOR_ROUNDS:-300}
BENCH_FILESYSTEMS=${BENCH_FILESYSTEMS-ext4 xfs}
DELEGATE_COST=${DELEGATE_COST:-1}
while (($#)); do
  case $1 in
  --quick)
    ITERATIONS=40 WARMUP=5 LARGE_RECORDS=500 DUMP_RUNS=3 RSS_RUNS=2 BURST=40 BURST_RUNS=3 FLOOR_ROUNDS=60
    DELEGATE_COST=0
    ;;
  --rounds)
    [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "bench: --rounds needs a number" >&2; exit 2; }
    FLOOR_ROUNDS=$2
    shift
    ;;
  -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) echo "bench: unknown argument $1 (--quick, --rounds N)" >&2; exit 2 ;;
  esac
  shift
done

# Targets (docs/benchmarks.md). ADD and DEL against the exec of the static no-op, in the same rounds, with the
# state on every file system a node's /var/lib may be (journaled ext4 and XFS, and BENCH_BASE_DIR's own): the
# boot-scoped store syncs nothing on either (docs/store.md), so only the plugin's own work is left to measure.
readonly MAX_ADD_EXECS=1.5 MAX_DEL_EXECS=1.3
# The store's size must not show, the dump of a large one stays short, and the plugin's process small. The
# dump is the operator's command (sandbox-guard-ctl) and sorts a plain vector of its records: its bound is for
# 10,000 records, about ninety times the 110 pods a node runs by default.
readonly MAX_GROWTH_RATIO=1.20 MAX_DUMP_MS=500 MAX_RSS_KIB=3072 MAX_DUMP_RSS_KIB=16384
# Reported beside them, not checked: ratios of medians to Debian's Go `tuning` in the same run (its no-op
# ADD is a Go exec, not a floor).
readonly TUNING_ADD_RATIO=0.70 TUNING_DEL_RATIO=0.55 TUNING_ADD_DEL_RATIO=0.6 TUNING_VERSION_RATIO=0.45 TUNING_BURST_RATIO=0.85
# A node's restore of its dual-stack pods against the baseline binary's, when one is given.
readonly MAX_RESTORE_RATIO=1.10
# No verb of one pod waits for another pod's primary: with hung deferred DELs of other pods, at most this long.
readonly MAX_UNRELATED_VERB_MS=500
RESTORE_PODS=${RESTORE_PODS:-50}
RESTORE_RUNS=${RESTORE_RUNS:-5}
HUNG_ENTRIES=${HUNG_ENTRIES:-50}
HUNG_ROUNDS=${HUNG_ROUNDS:-30}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo
. "$repo/scripts/lib/packages.sh"
. "$repo/scripts/lib/build.sh"
readonly cni_dir=/usr/lib/cni
readonly tuning_bin=$cni_dir/tuning
readonly network=benchnet ifname=eth0 pod_namespace=bench

say() { printf '%s\n' "$*" >&2; }
die() { say "bench: $*"; exit 2; }

[[ $EUID -eq 0 ]] || die "needs root (ip netns, state dirs under $BENCH_BASE_DIR): sudo bash scripts/bench.sh"
((BASH_VERSINFO[0] >= 5)) || die "needs bash >= 5 for \$EPOCHREALTIME"


build_release() {
  if [[ -n ${SANDBOX_GUARD_BIN:-} ]]; then
    guard_bin=$SANDBOX_GUARD_BIN
  else
    say "building the release binary"
    guard_bin=$(build_plugin "$repo") || die "cargo build failed"
  fi
  [[ -x $guard_bin ]] || die "no executable at $guard_bin"
}

# The operator's binary beside a plugin, which the dump and --restore rows run directly (the plugin would
# exec it); the plugin itself for a build from before the two were split.
ctl_of() { # plugin
  local ctl
  ctl=$(dirname "$1")/sandbox-guard-ctl
  if [[ -x $ctl ]]; then echo "$ctl"; else echo "$1"; fi
}

# The baseline: a binary given, or a git ref exported into a checkout of its own (under target/, with its own
# target dir) and built there the same way.
build_baseline() {
  baseline_bin=${BASELINE_BIN:-}
  if [[ -z $baseline_bin && -n ${BASELINE_REF:-} ]]; then
    local checkout=$repo/target/baseline-src
    say "building the baseline binary from $BASELINE_REF"
    # Its target dir stays from one run to the next: only the sources are replaced.
    mkdir -p "$checkout" && find "$checkout" -mindepth 1 -maxdepth 1 ! -name target -exec rm -rf {} +
    git -C "$repo" archive "$BASELINE_REF" | tar -x -C "$checkout" || die "cannot export $BASELINE_REF"
    # With the build library of its own tree: a ref is built as its release was (48d30cf and the refs
    # before it do not build for musl). Refs from e5adcfa on have one this script can source.
    [[ -f $checkout/scripts/lib/build.sh ]] || die "$BASELINE_REF has no scripts/lib/build.sh: give BASELINE_BIN instead"
    baseline_bin=$(. "$checkout/scripts/lib/build.sh" && build_plugin "$checkout") ||
      die "cargo build of $BASELINE_REF failed"
  fi
  [[ -z $baseline_bin || -x $baseline_bin ]] || die "no executable at $baseline_bin"
}

work='' netns='' primary_bridge='' api_server_pid=''
declare -A mode_netns=() # delegate-cost mode -> its netns
restore_netns=() restore_masters=() # the restore comparison's pods, LANs and masters
mounts=()                # loop-mounted file systems

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local ns
  # Everything here runs whatever failed before it: under errexit a worker that had already
  # exited (its kill failing) ended the script here, leaving the loop mounts and the work dir.
  set +e
  declare -F stop_hung_workers >/dev/null && stop_hung_workers
  [[ -n $netns ]] && ip netns del "$netns" 2>/dev/null # takes the veth pair with it
  for ns in "${mode_netns[@]}" "${restore_netns[@]}"; do ip netns del "$ns" 2>/dev/null; done
  for ns in "${restore_masters[@]}"; do ip link del "$ns" 2>/dev/null; done
  [[ -n $primary_bridge ]] && ip link del "$primary_bridge" 2>/dev/null
  [[ -n $api_server_pid ]] && kill "$api_server_pid" 2>/dev/null
  for ns in "${mounts[@]}"; do umount "$ns" 2>/dev/null; done
  [[ -n $work ]] && rm -rf -- "$work"
  return 0
}
trap cleanup EXIT
trap 'exit 2' INT TERM HUP

need_packages containernetworking-plugins time iproute2 jq file e2fsprogs xfsprogs gcc libc6-dev musl-tools linux-libc-dev openssl util-linux-extra
build_release
build_baseline

mkdir -p "$BENCH_BASE_DIR"
work=$(mktemp -d "$BENCH_BASE_DIR/sandbox-guard-bench.XXXXXX")
fs_type=$(stat -f -c %T "$work")
# ADD and DEL fsync their records: on a RAM file system that cost would vanish and flatter the plugin.
case $fs_type in tmpfs | ramfs) die "$BENCH_BASE_DIR is on $fs_type; point BENCH_BASE_DIR at a disk" ;; esac

# The floor: a static no-op (what any exec costs) and a static program that makes one durable commit the
# way a careful writer does, both fed the same stdin as the plugin, through the same path.
noop_bin=$work/noop commit_bin=$work/commit kernel_add_bin=$work/kernel_add
printf 'int main(void) { return 0; }\n' >"$work/noop.c"
cat >"$work/commit.c" <<'C'
/* One durable commit in DIR: about 700 bytes to a temp file, fdatasync, rename into place, fsync of DIR. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
  char tmp[4096], dst[4096], data[700];
  if (argc != 2) return 2;
  snprintf(tmp, sizeof tmp, "%s/.commit.%d.tmp", argv[1], (int)getpid());
  snprintf(dst, sizeof dst, "%s/commit", argv[1]);
  memset(data, 'x', sizeof data);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, data, sizeof data) != (ssize_t)sizeof data || fdatasync(fd) || close(fd)) return 1;
  if (rename(tmp, dst)) return 1;
  int dir = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0 || fsync(dir) || close(dir)) return 1;
  return 0;
}
C
# And ADD's own system calls with none of its user-space work: the kernel's side of ADD as the guard does
# it (the pod's link facts read through a netlink socket made in its netns, the store's lock, the boot id
# and the store's boot marker read, the record, the owner and the address index written as files of the
# sizes the guard writes for the bench's pod, the record an O_TMPFILE linked in and the others a temporary
# file renamed into place, nothing synced: docs/store.md),
# reported beside the floor.
cat >"$work/kernel_add.c" <<'C'
/* ADD's kernel work in STATE for the interface IFNAME of the netns at NETNS; SERIAL names the entries.
 * Asks what the guard asks (the link and its host-side peer without counters, the addresses and the
 * routes), reads the boot id and STATE/boot, writes a record of RECORD bytes as the guard does (an
 * O_TMPFILE linked into records/), then the owner and the address entry as temporary files renamed
 * into owners/ and ips/. No parsing beyond the netlink framing, no checksum, no sync. */
/* The bench pod's entries as the guard writes them (format 2, sealed plain JSON). */
#define RECORD 1227
#define OWNER 391
#define ADDRESS 375
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>
static char answer[65536];
static int peer; /* IFLA_LINK of the first link answered */
static int ask(int sock, int type, int dump, int index, const char *name) {
  struct { struct nlmsghdr h; struct ifinfomsg i; char attrs[64]; } req;
  memset(&req, 0, sizeof req);
  int len = NLMSG_LENGTH(sizeof req.i);
  req.h.nlmsg_type = type, req.h.nlmsg_flags = NLM_F_REQUEST | (dump ? NLM_F_DUMP : 0), req.i.ifi_index = index;
  if (name) {
    struct rtattr *a = (struct rtattr *)((char *)&req + NLMSG_ALIGN(len));
    a->rta_type = IFLA_IFNAME, a->rta_len = RTA_LENGTH(strlen(name) + 1);
    strcpy(RTA_DATA(a), name);
    len = NLMSG_ALIGN(len) + RTA_ALIGN(a->rta_len);
  }
  if (type == RTM_GETLINK) { /* without the counters, as the guard asks */
    struct rtattr *a = (struct rtattr *)((char *)&req + NLMSG_ALIGN(len));
    a->rta_type = IFLA_EXT_MASK, a->rta_len = RTA_LENGTH(4), *(unsigned *)RTA_DATA(a) = RTEXT_FILTER_SKIP_STATS;
    len = NLMSG_ALIGN(len) + RTA_ALIGN(a->rta_len);
  }
  req.h.nlmsg_len = len;
  if (send(sock, &req, len, 0) != len) return -1;
  for (;;) {
    int n = recv(sock, answer, sizeof answer, 0);
    if (n <= 0) return -1;
    for (struct nlmsghdr *h = (struct nlmsghdr *)answer; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_ERROR) return -1;
      if (h->nlmsg_type == NLMSG_DONE) return 0;
      if (h->nlmsg_type == RTM_NEWLINK && !peer) {
        int left = IFLA_PAYLOAD(h);
        for (struct rtattr *a = IFLA_RTA(NLMSG_DATA(h)); RTA_OK(a, left); a = RTA_NEXT(a, left))
          if (a->rta_type == IFLA_LINK) peer = *(int *)RTA_DATA(a);
      }
      if (!(h->nlmsg_flags & NLM_F_MULTI)) return 0;
    }
  }
}
/* A temporary file of LEN bytes renamed to DIR/NAME, as the guard replaces an entry. */
static int replace(const char *state, const char *dir, const char *name, const char *text, int len) {
  char temp[4096], path[4096];
  snprintf(temp, sizeof temp, "%s/%s/.%d.tmp", state, dir, getpid());
  snprintf(path, sizeof path, "%s/%s/%s", state, dir, name);
  int fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, text, len) != len || rename(temp, path)) return -1;
  return close(fd);
}
/* The whole of a small file, as the guard reads the boot id and the marker. */
static int slurp(const char *path, char *into, int size) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), got = 0, n;
  if (fd < 0) return -1;
  while ((n = read(fd, into + got, size - got)) > 0) got += n;
  close(fd);
  return got;
}
int main(int argc, char **argv) {
  char input[16384], path[4096], small[128];
  ssize_t got = 0, n;
  if (argc != 5) return 2;
  while ((n = read(0, input + got, sizeof input - got)) > 0) got += n;
  int pod = open(argv[2], O_RDONLY | O_CLOEXEC), self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  int host = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (pod < 0 || self < 0 || host < 0 || setns(pod, CLONE_NEWNET)) return 1;
  int inside = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (inside < 0 || setns(self, CLONE_NEWNET)) return 1;
  if (ask(inside, RTM_GETLINK, 0, 0, argv[3]) || ask(inside, RTM_GETADDR, 1, 0, NULL) ||
      ask(inside, RTM_GETROUTE, 1, 0, NULL) || ask(host, RTM_GETLINK, 0, peer ? peer : 1, NULL))
    return 1;
  close(inside), close(host), close(self), close(pod);
  snprintf(path, sizeof path, "%s/lock", argv[1]);
  int lock = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock < 0 || flock(lock, LOCK_EX)) return 1;
  snprintf(path, sizeof path, "%s/boot", argv[1]);
  if (slurp("/proc/sys/kernel/random/boot_id", small, sizeof small) < 0 || slurp(path, small, sizeof small) < 0)
    return 1;
  memset(input + got, ' ', sizeof input - got);
  snprintf(path, sizeof path, "%s/records", argv[1]);
  int record = open(path, O_WRONLY | O_TMPFILE | O_CLOEXEC, 0600);
  snprintf(path, sizeof path, "%s/records/%s", argv[1], argv[4]);
  if (record < 0 || write(record, input, RECORD) != RECORD || linkat(record, "", AT_FDCWD, path, AT_EMPTY_PATH) ||
      close(record))
    return 1;
  if (replace(argv[1], "owners", argv[4], input, OWNER) || replace(argv[1], "ips", argv[4], input, ADDRESS))
    return 1;
  if (write(1, input, got < 350 ? got : 350) < 0) return 1;
  return 0;
}
C
# Linked against musl, as the plugin is (scripts/lib/build.sh): glibc's start-up makes dozens of CPUID probes,
# each a trap to the hypervisor on a VM, that musl's makes none of, so a glibc floor would credit the plugin
# with glibc's start-up. musl-gcc reads no header outside musl's own: the kernel's netlink headers are handed
# to it alone. The same no-op linked against glibc (the floor of the runs before the plugin moved to musl) is
# timed beside them, reported, not checked.
kernel_headers=$work/kernel-headers
mkdir -p "$kernel_headers" && ln -s /usr/include/linux /usr/include/asm-generic "$kernel_headers/" &&
  ln -s "/usr/include/$(gcc -print-multiarch)/asm" "$kernel_headers/asm" || die "cannot link the kernel's headers for musl-gcc"
for program in noop commit kernel_add; do
  musl-gcc -O2 -static -isystem "$kernel_headers" -o "$work/$program" "$work/$program.c" ||
    die "cannot build the static $program program (musl-tools, linux-libc-dev)"
done
noop_glibc_bin=$work/noop-glibc
gcc -O2 -static -o "$noop_glibc_bin" "$work/noop.c" || die "cannot build the static glibc no-op (gcc, libc6-dev)"

# Every binary the rounds exec is written whole into a bin dir of the bench's own, as an installer writes a
# plugin into a node's, and its pages are then dropped from the page cache, so that each runs as on a node
# after a reboot (the installer skips a binary whose bytes are there already; the first exec reads it back).
# How an executable's pages came into the page cache changes what its exec costs; of a node's two states
# (written whole by an install, read back after a reboot) this was the slower for the plugin here
# (docs/benchmarks.md). The plugin as an install leaves it, its pages written whole, is timed beside it in
# the floor, reported, not checked.
written_bin() { # file dir -> the copy's path
  local to
  to=$2/$(basename "$1")
  mkdir -p "$2" && cat "$1" >"$to" && chmod 0755 "$to" && sync -f "$to" && echo "$to"
}
install_bin() { # file dir -> the copy's path, its pages dropped
  local to
  to=$(written_bin "$1" "$2") && dd if="$to" iflag=nocache count=0 status=none || return 1
  local resident
  resident=$(fincore -n -b -o RES "$to") || { say "fincore $to failed (util-linux-extra)"; return 1; }
  ((resident == 0)) || { say "the pages of $to stayed in the page cache"; return 1; }
  echo "$to"
}
plugin_with_ctl() { # copier plugin dir -> the plugin's copy, the ctl beside it copied too
  local ctl
  ctl=$(ctl_of "$2")
  [[ $ctl == "$2" ]] || "$1" "$ctl" "$3" >/dev/null || return 1
  "$1" "$2" "$3"
}
written_guard_bin=$(plugin_with_ctl written_bin "$guard_bin" "$work/bin/written") ||
  die "cannot copy $guard_bin into $work/bin/written"
guard_bin=$(plugin_with_ctl install_bin "$guard_bin" "$work/bin/guard") || die "cannot copy the plugin into $work/bin/guard"
if [[ -n $baseline_bin ]]; then
  baseline_bin=$(plugin_with_ctl install_bin "$baseline_bin" "$work/bin/baseline") ||
    die "cannot copy the baseline into $work/bin/baseline"
fi
noop_bin=$(install_bin "$noop_bin" "$work/bin") && commit_bin=$(install_bin "$commit_bin" "$work/bin") &&
  kernel_add_bin=$(install_bin "$kernel_add_bin" "$work/bin") && noop_glibc_bin=$(install_bin "$noop_glibc_bin" "$work/bin") ||
  die "cannot copy the floor's programs"

# A real netns with the pod end of a veth named as in prevResult: tuning's ADD enters it and must succeed.
netns=sgbench-$$
netns_path=/run/netns/$netns
ip netns add "$netns"
ip link add "sgb$$" type veth peer name "$ifname" netns "$netns"

guard_keys=${GUARD_KEYS:-}
guard_keys=${guard_keys//@WORK@/$work}
version_input='{"cniVersion":"1.0.0"}'
small_state=$work/state-small large_state=$work/state-large baseline_state=$work/state-baseline

# One pod attachment: container, pod, UID, address and MACs all derive from a serial, so no two ADDs of the
# run share any of them (a shared address would make every ADD look like the IP reuse the guard reports).
# Kinds keep the serials of the phases below apart.
readonly preflight_kind=1 fill_kind=2 round_kind=3 rss_kind=4 burst_kind=6 fs_kind=7 again_kind=9 ask_owner_kind=12 ask_kind=13
attachment() { # kind serial -> cid pod uid prev_result
  local serial=$(($1 * 1000000 + $2)) hex
  local a=$((serial >> 16 & 255)) b=$((serial >> 8 & 255)) c=$((serial & 255))
  printf -v cid '%064x' "$serial"
  printf -v uid '%08x-0000-4000-8000-%012x' "$1" "$2"
  pod=pod-$1-$2
  printf -v hex '%02x:%02x:%02x' "$a" "$b" "$c"
  # What a bridge + host-local primary hands to the chained plugins.
  prev_result='{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"0a:58:0a:00:00:01"},{"name":"veth'${cid: -8}'","mac":"6e:58:0a:'$hex'"},{"name":"'$ifname'","mac":"0a:58:0a:'$hex'","sandbox":"'$netns_path'"}],"ips":[{"address":"10.'$a.$b.$c'/8","gateway":"10.0.0.1","interface":2}],"routes":[{"dst":"0.0.0.0/0","gw":"10.0.0.1"}],"dns":{"nameservers":["10.96.0.10"],"search":["bench.svc.cluster.local","svc.cluster.local","cluster.local"],"options":["ndots:5"]}}'
}
# Stdin for a plugin, with the current attachment's prevResult; into a variable, as a fork would be timed
# (or slow down populating).
plugin_config() { # variable type [extra keys]
  printf -v "$1" '{"cniVersion":"1.0.0","name":"%s","type":"%s"%s,"prevResult":%s}' "$network" "$2" "${3:-}" "$prev_result"
}
guard_config() { plugin_config "$1" sandbox-guard ",\"stateDir\":\"$2\"${guard_keys:-}"; } # variable state-dir

# Prepended to every plugin run; the RSS pass puts GNU time here.
launcher=()

# The config goes in through a pipe (a here-string that small is one in bash 5), as a runtime passes it.
cni() { # binary verb stdin-text; the current attachment
  CNI_COMMAND=$2 CNI_CONTAINERID=$cid CNI_NETNS=$netns_path CNI_IFNAME=$ifname CNI_PATH=$cni_dir \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$pod_namespace;K8S_POD_NAME=$pod;K8S_POD_INFRA_CONTAINER_ID=$cid;K8S_POD_UID=$uid" \
    "${launcher[@]}" "$1" <<<"$3"
}
guard() { cni "$guard_bin" "$@"; }
baseline() { cni "$baseline_bin" "$@"; }
tuning() { cni "$tuning_bin" "$@"; }

declare -A samples=() # case label -> space-separated microseconds
timed() { # label command...
  local label=$1 start rc=0
  shift
  start=${EPOCHREALTIME/./}
  "$@" >/dev/null || rc=$?
  samples[$label]+="$((${EPOCHREALTIME/./} - start)) "
  ((rc == 0)) || { say "$label failed with exit $rc; rerun: $(printf '%q ' "$@")"; "$@" >&2 || true; exit 2; }
}

contract_problems=()
contract() { contract_problems+=("$*"); say "CONTRACT: $*"; }
record_file() { printf '%s/records/%s:%s:%s' "$1" "$network" "$cid" "$ifname"; } # state dir
# On a journal a record is a symlink whose target is its text (docs/store.md): -L as well as -f,
# and never -e, which follows the link.
has_record() { [[ -L $1 || -f $1 ]]; }
count_records() { find "$1/records" -maxdepth 1 \( -type f -o -type l \) 2>/dev/null | wc -l; }

# --- Preflight: every case must do its real work once, untimed, before any number means anything. ---
attachment "$preflight_kind" 1
out=$(tuning VERSION "$version_input") || die "tuning VERSION failed: $out"
out=$(guard VERSION "$version_input") || die "sandbox-guard VERSION failed: $out"
for v in 0.3.0 0.3.1 0.4.0 1.0.0 1.1.0; do
  jq -e --arg v "$v" '.supportedVersions | index($v)' <<<"$out" >/dev/null || contract "VERSION does not list $v: $out"
done
plugin_config config tuning
out=$(tuning ADD "$config") || die "tuning no-op ADD failed: $out"
jq -e '.interfaces[2].sandbox' <<<"$out" >/dev/null || die "tuning ADD returned no result: $out"

guard_config config "$small_state"
out=$(guard ADD "$config") || die "sandbox-guard ADD failed: $out"
# $(...) drops a trailing newline, which a runtime's JSON decoder ignores too.
[[ $out == "$prev_result" ]] || contract "ADD did not print prevResult byte for byte: $out"
has_record "$(record_file "$small_state")" || contract "ADD wrote no $(record_file "$small_state")"
# What every timed ADD must do too: read the pod's link from its netns.
jq -e '.record.links.state == "observed"' "$(record_file "$small_state")" >/dev/null 2>&1 ||
  contract "ADD recorded no link facts for $ifname in $netns_path"
out=$(guard DEL "$config") || die "sandbox-guard DEL failed: $out"
! has_record "$(record_file "$small_state")" || contract "DEL left $(record_file "$small_state")"
out=$(guard DEL "$config") || contract "a repeated DEL failed (DEL must be idempotent): $out"

# --- The API server's view (docs/api-server-check.md): where the local rule cannot decide, the plugin
# execs sandbox-guard-ctl, which GETs the pod over TLS. A local stand-in answers the GET: `openssl s_server
# -WWW` serving the pod's JSON as a file under the request's path, with a certificate of a CA of its own,
# so that the client's exec, its kubeconfig, its TLS handshake and the request are all paid, and only the
# API server's own work and the network are not (a real API server answered the doctor's GET in 5 ms:
# docs/runs/2026-12-05-29dd12d-api-server-check.md). Each round of the "ask" case makes the name's owner
# a sandbox of another pod UID (untimed), then times an ADD that asks (rule 8: a record of another UID)
# and the owner's DEL, which asks too (rule 7), against the same pod's ADD and DEL in the "small" case.
ask_state=$work/state-ask ask_www=$work/api-www ask_port=$((20000 + $$ % 20000))
ask_kubeconfig=$work/api.kubeconfig
mkdir -p "$ask_www/api/v1/namespaces/$pod_namespace/pods"
(
  cd "$work"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=bench-ca \
    -keyout api-ca.key -out api-ca.crt -days 1
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
    -keyout api.key -out api.csr
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >api.ext
  openssl x509 -req -in api.csr -CA api-ca.crt -CAkey api-ca.key -CAcreateserial -days 1 -extfile api.ext \
    -out api.crt
) >/dev/null 2>&1 || die "openssl could not make the stand-in API server's certificates"
(cd "$ask_www" && exec openssl s_server -quiet -accept "127.0.0.1:$ask_port" -cert "$work/api.crt" \
  -key "$work/api.key" -WWW) >"$work/api-server.log" 2>&1 &
api_server_pid=$!
jq -n --arg server "https://127.0.0.1:$ask_port" --arg ca "$(base64 -w0 "$work/api-ca.crt")" \
  '{apiVersion: "v1", kind: "Config", "current-context": "bench",
    contexts: [{name: "bench", context: {cluster: "bench", user: "bench"}}],
    clusters: [{name: "bench", cluster: {server: $server, "certificate-authority-data": $ca}}],
    users: [{name: "bench", user: {token: "bench"}}]}' >"$ask_kubeconfig"
chmod 600 "$ask_kubeconfig"
# The log says of each ask that went unanswered (outcome=api-unanswered): the rounds must have none, or
# the figures time the bound, not an answer. One appended line per verb, against the ask's milliseconds.
ask_log=$work/ask.log
readonly ask_keys=",\"kubeconfig\":\"$ask_kubeconfig\",\"podKeyScope\":\"cluster\",\"logFile\":\"$ask_log\""
api_pod() { # name uid node: what the stand-in answers for the pod
  jq -cn --arg ns "$pod_namespace" --arg name "$1" --arg uid "$2" --arg node "$3" \
    '{kind: "Pod", metadata: {namespace: $ns, name: $name, uid: $uid}, spec: {nodeName: $node}}' \
    >"$ask_www/api/v1/namespaces/$pod_namespace/pods/$1"
}
ctl_bin=$(ctl_of "$guard_bin")
api_pod ctl-probe uid-ctl-probe bench-node
for ((n = 0; n < 50; n++)); do
  "$ctl_bin" --get-pod "$pod_namespace/none" "$ask_kubeconfig" 2>&1 | grep -q 'not a pod' && break
  sleep 0.1
done
# The check must be able to fail: the API shows the name as another pod's on another node, and the
# owner's DEL is refused (code 11), which only the answer can have said.
attachment "$preflight_kind" 2
api_pod "$pod" someone-else other-node
guard_config config "$ask_state"
out=$(guard ADD "$config") || die "the ask's preflight ADD failed: $out"
guard_keys="${guard_keys:-}$ask_keys" guard_config ask_config "$ask_state"
if out=$(guard DEL "$ask_config"); then
  die "the owner's DEL asked the stand-in API server, which shows the name as another pod's, and was not refused: $out (is $ctl_bin there?)"
fi
jq -e '.code == 11 and (.msg | contains("someone-else"))' <<<"$out" >/dev/null ||
  die "the owner's DEL was refused, not for the API's pod: $out"
# Chained mode takes the refused sandbox's interface out of its netns (docs/api-server-check.md), and
# this one is the bench's shared pod end: put back, or every later ADD would find no link to record.
! ip -n "$netns" link show "$ifname" >/dev/null 2>&1 ||
  contract "the owner's DEL refused by rule 7 left $ifname in its netns"
ip -n "$netns" link show "$ifname" >/dev/null 2>&1 || ip link add "sgb$$" type veth peer name "$ifname" netns "$netns" ||
  die "cannot put $ifname back into $netns_path"
out=$(guard DEL "$config") || die "the ask's preflight DEL, without the kubeconfig, failed: $out"
# And rule 8's: an ADD of the name, owned here by a sandbox of another pod UID, while the API shows a third
# UID, is refused (code 104), which only the answer can have said.
attachment "$preflight_kind" 3
pod=ask-preflight
guard_config config "$ask_state"
out=$(guard ADD "$config") || die "the ask's preflight owner ADD failed: $out"
owner_config=$config owner_cid=$cid owner_uid=$uid
attachment "$preflight_kind" 4
pod=ask-preflight
api_pod "$pod" a-third-uid bench-node
guard_keys="${guard_keys:-}$ask_keys" guard_config ask_config "$ask_state"
if out=$(guard ADD "$ask_config"); then
  die "an ADD of a name owned here by another pod UID asked the stand-in API server, which shows a third UID, and was not refused: $out"
fi
jq -e '.code == 104 and (.msg | contains("a-third-uid"))' <<<"$out" >/dev/null ||
  die "the late ADD was refused, not for the API's pod: $out"
cid=$owner_cid uid=$owner_uid
out=$(guard DEL "$owner_config") || die "the ask's preflight owner DEL failed: $out"
: >"$ask_log"

populate() { # state count
  local n start=$SECONDS config
  say "populating $(basename "$1") with $2 records"
  for ((n = 1; n <= $2; n++)); do
    attachment "$fill_kind" "$n"
    guard_config config "$1"
    guard ADD "$config" >/dev/null || die "populating ADD #$n failed"
    ((n % 2000)) || say "  $n records, $((SECONDS - start)) s"
  done
  local have
  have=$(count_records "$1")
  ((have == $2)) || contract "$2 ADDs left $have entries in $1/records"
}
populate "$small_state" "$SMALL_RECORDS"
populate "$large_state" "$LARGE_RECORDS"
if [[ -n $baseline_bin ]]; then
  guard_bin=$baseline_bin populate "$baseline_state" "$SMALL_RECORDS"
fi

# --- Latency: one round runs every case once, in a fresh random order. A fixed order would charge costs one
# case defers to the same next case every time: an fsync also flushes whatever an earlier run left unsynced.
# Each round is a fresh attachment, so ADD creates a record and DEL removes it and the stores keep their
# size; tuning gets the same prevResult as sandbox-guard.
shuffled() { # variable item...: the items in a random order
  local -n into=$1
  local k j swap
  shift
  into=("$@")
  for ((k = ${#into[@]} - 1; k > 0; k--)); do
    j=$((RANDOM % (k + 1)))
    swap=${into[k]} into[k]=${into[j]} into[j]=$swap
  done
}
# The round's pod, its name owned first by a sandbox of another UID: set up and taken down untimed, with a
# config that does not ask; then the timed ADD and DEL that ask.
ask_round() { # label-prefix state-dir plugin-function
  local cid pod uid prev_result owner_input owner_cid owner_uid input
  attachment "$ask_owner_kind" "$round"
  pod=ask-$round
  guard_config owner_input "$2"
  "$3" ADD "$owner_input" >/dev/null || die "the ask case's owner ADD ($1) failed"
  owner_cid=$cid owner_uid=$uid
  attachment "$ask_kind" "$round"
  pod=ask-$round
  api_pod "$pod" "$uid" bench-node
  guard_keys="${guard_keys:-}$ask_keys" guard_config input "$2"
  timed "$1_add_ask" "$3" ADD "$input"
  timed "$1_del_ask" "$3" DEL "$input"
  cid=$owner_cid uid=$owner_uid
  "$3" DEL "$owner_input" >/dev/null || die "the ask case's owner DEL ($1) failed"
}
run_case() { # case
  case $1 in
  spawn) timed spawn /bin/true ;;
  tuning_version) timed tuning_version tuning VERSION "$version_input" ;;
  guard_version) timed guard_version guard VERSION "$version_input" ;;
  tuning_add) timed tuning_add tuning ADD "${round_input[tuning]}" ;;
  ctl_get) timed ctl_get "$ctl_bin" --get-pod "$pod_namespace/ctl-probe" "$ask_kubeconfig" ;;
  ask) ask_round guard "$ask_state" guard ;;
  ask_baseline) ask_round baseline "$baseline_ask_state" baseline ;;
  small | large)
    timed "guard_add_$1" guard ADD "${round_input[$1]}"
    timed "guard_del_$1" guard DEL "${round_input[$1]}"
    ;;
  baseline)
    timed baseline_add baseline ADD "${round_input[baseline]}"
    timed baseline_del baseline DEL "${round_input[baseline]}"
    ;;
  esac
}
cases=(spawn tuning_version guard_version tuning_add small large ask ctl_get)
[[ -z $baseline_bin ]] || cases+=(baseline)
# The baseline's asks too, where it asks (a ctl beside it): the same stand-in, in the same rounds.
baseline_ask_state=$work/state-ask-baseline
[[ -z $baseline_bin || $(ctl_of "$baseline_bin") == "$baseline_bin" ]] || cases+=(ask_baseline)
declare -A round_input=() # tuning, small, large -> stdin text
say "timing $ITERATIONS rounds (+$WARMUP warm-up) of: ${cases[*]}"
for ((round = 0; round < WARMUP + ITERATIONS; round++)); do
  ((round != WARMUP)) || samples=()
  attachment "$round_kind" "$round"
  # Built before the clock starts: only the plugins' own work is timed.
  plugin_config 'round_input[tuning]' tuning
  guard_config 'round_input[small]' "$small_state"
  guard_config 'round_input[large]' "$large_state"
  guard_config 'round_input[baseline]' "$baseline_state"
  shuffled order "${cases[@]}"
  for case in "${order[@]}"; do run_case "$case"; done
done
[[ $(count_records "$large_state") -eq $LARGE_RECORDS ]] || contract "the ADD/DEL rounds changed the record count of the large store"
[[ -f $ask_log ]] || contract "the ask log $ask_log is gone: nothing says whether the rounds' asks were answered"
unanswered=$(grep -c 'outcome=api-unanswered' "$ask_log" || true)
((unanswered == 0)) || contract "$unanswered of the rounds' asks went unanswered (see $ask_log): the ask rows time the bound"
# Only the rounds ask the stand-in; a job left running would hold up the restore set-up's `wait`.
kill "$api_server_pid" 2>/dev/null
wait "$api_server_pid" 2>/dev/null || true
api_server_pid=''

# --- A burst: a node starting its pods, BURST ADDs of new pods (each its own address) in a row, no DEL
# between, against as many of tuning's no-op ADDs; BURST_RUNS bursts of each, alternating at random. The
# inputs are built before a burst starts; a burst's time is the sum of its execs' times.
burst() { # label guard-state-dir|"" serial-base
  local n label=$1 state=$2 base=$3 start total=0
  local -a inputs=()
  for ((n = 0; n < BURST; n++)); do
    attachment "$burst_kind" $((base + n))
    if [[ -n $state ]]; then guard_config 'inputs[n]' "$state"; else plugin_config 'inputs[n]' tuning; fi
  done
  for ((n = 0; n < BURST; n++)); do
    attachment "$burst_kind" $((base + n)) # for the CNI_* variables
    start=${EPOCHREALTIME/./}
    if [[ -n $state ]]; then guard ADD "${inputs[n]}" >/dev/null; else tuning ADD "${inputs[n]}" >/dev/null; fi ||
      die "$label: ADD #$n of a burst failed"
    total=$((total + ${EPOCHREALTIME/./} - start))
  done
  samples[$label]+="$total "
}
bursts() { # label-prefix state-base serial-offset
  local run who
  say "timing $BURST_RUNS bursts of $BURST ADDs ($1): sandbox-guard and tuning"
  for ((run = 0; run < BURST_RUNS; run++)); do
    shuffled order guard tuning
    for who in "${order[@]}"; do
      case $who in
      guard) burst "${1}burst_guard" "$2-burst-$run" $(($3 + run * BURST)) ;;
      tuning) burst "${1}burst_tuning" '' $(($3 + run * BURST)) ;;
      esac
    done
  done
}
bursts '' "$work/state" 0

# --- The floor: ADD and DEL against one durable commit and a no-op exec, with the state on journaling file
# systems the bench makes itself (ext4 with its journal and XFS, on loop-mounted image files under
# BENCH_BASE_DIR, so their flushes reach the same disk: a loop device's flush is an fsync of its image file)
# and on BENCH_BASE_DIR's own. Every round runs the no-op, tuning's no-op ADD and, on each file system, the
# commit and the guard's ADD then DEL, then the ADD of the same pod made again (below), and the baseline's
# three where one is given, all in a random order; each round a fresh pod. Then the burst on each
# loop-mounted file system.
floor_fs=(base) fs_cases=()
declare -A floor_dir=([base]=$work/floor) floor_name=()
journal_of() { # dir -> how its file system journals, for the report
  local type device
  type=$(stat -f -c %T "$1")
  case $type in
  ext2/ext3)
    device=$(basename "$(readlink "/sys/dev/block/$(stat -c %Hd:%Ld "$1")")")
    if [[ -e /proc/fs/jbd2/$device-8 ]]; then echo "ext4 with a journal"; else echo "ext4 without a journal"; fi ;;
  *) echo "$type" ;;
  esac
}
floor_name[base]="$BENCH_BASE_DIR ($(journal_of "$work"))"
for fs in $BENCH_FILESYSTEMS; do
  image=$work/$fs.img mnt=$work/mnt-$fs
  truncate -s 1G "$image" && mkdir -p "$mnt"
  case $fs in
  ext4) mkfs.ext4 -q -F -O has_journal "$image" ;;
  xfs) mkfs.xfs -q -f "$image" ;;
  *) die "BENCH_FILESYSTEMS: no mkfs for $fs" ;;
  esac
  mount -o loop "$image" "$mnt" || die "mount -o loop $image failed"
  mounts+=("$mnt")
  fs_cases+=("$fs") floor_fs+=("$fs")
  floor_dir[$fs]=$mnt/floor
  floor_name[$fs]="$(journal_of "$mnt"), loop-mounted"
done
for fs in "${floor_fs[@]}"; do
  mkdir -p "${floor_dir[$fs]}/commit" "${floor_dir[$fs]}"/kernel-add/{records,owners,ips}
  printf '{"formatVersion":2,"bootId":"%s"}\n' "$(</proc/sys/kernel/random/boot_id)" >"${floor_dir[$fs]}/kernel-add/boot"
  attachment "$preflight_kind" 3
  guard_config config "${floor_dir[$fs]}/state"
  guard ADD "$config" >/dev/null && guard DEL "$config" >/dev/null || die "ADD/DEL in ${floor_dir[$fs]} failed"
  compgen -G "${floor_dir[$fs]}/state/ips/$network:*" >/dev/null ||
    contract "a DEL left no address entry in ${floor_dir[$fs]}: the ADD of a pod made again replaces none"
  "$commit_bin" "${floor_dir[$fs]}/commit" || die "the commit program failed in ${floor_dir[$fs]}/commit"
  "$kernel_add_bin" "${floor_dir[$fs]}/kernel-add" "$netns_path" "$ifname" preflight </dev/null >/dev/null ||
    die "the kernel_add program failed in ${floor_dir[$fs]}/kernel-add"
  if [[ -n $baseline_bin ]]; then
    guard_config config "${floor_dir[$fs]}/state-baseline"
    baseline ADD "$config" >/dev/null && baseline DEL "$config" >/dev/null ||
      die "the baseline's ADD/DEL in ${floor_dir[$fs]} failed"
  fi
done
# The pod made again (a StatefulSet's, under a new UID) with the address it had, once its old sandbox's DEL
# is through: a new sandbox whose ADD rewrites the address entry the old one left, as on a node where
# addresses come back (a sticky-IP primary; any IPAM once its range wraps). By then the kernel's flusher
# has written that entry out (dirty pages expire after 30 s), so its file system is synced first, untimed.
# Timed; its DEL is not.
again() { # plugin label input state-dir
  local cid=$cid_again uid=$uid_again
  sync -f "$4" || die "sync -f $4 failed"
  timed "$2" "$1" ADD "$3"
  "$1" DEL "$3" >/dev/null || die "$1: the DEL of the pod made again failed"
}
# The text on stdin, as cni() gives it to a plugin: inside the timed command.
# shellcheck disable=SC2317 # run through timed
stdin_to() { # text command...
  local text=$1
  shift
  "$@" <<<"$text"
}
floor_cases=(noop noop_glibc tuning written version)
for fs in "${floor_fs[@]}"; do
  floor_cases+=("commit:$fs" "kernel:$fs" "guard:$fs")
  [[ -z $baseline_bin ]] || floor_cases+=("baseline:$fs")
done
say "timing $FLOOR_ROUNDS rounds (+$WARMUP warm-up) of the floor on: ${floor_fs[*]}"
for ((round = 0; round < WARMUP + FLOOR_ROUNDS; round++)); do
  if ((round == WARMUP)); then
    for label in "${!samples[@]}"; do [[ $label != floor_* ]] || unset "samples[$label]"; done
  fi
  attachment "$fs_kind" "$round"
  printf -v cid_again '%064x' "$((again_kind * 1000000 + round))"
  printf -v uid_again '%08x-0000-4000-8000-%012x' "$again_kind" "$round"
  plugin_config 'round_input[tuning]' tuning
  guard_config 'round_input[written]' "${floor_dir[base]}/state-written"
  for fs in "${floor_fs[@]}"; do
    guard_config "round_input[$fs]" "${floor_dir[$fs]}/state"
    guard_config "round_input[baseline:$fs]" "${floor_dir[$fs]}/state-baseline"
  done
  shuffled order "${floor_cases[@]}"
  for case in "${order[@]}"; do
    fs=${case#*:}
    case $case in
    noop) timed floor_noop stdin_to "${round_input[tuning]}" "$noop_bin" ;;
    noop_glibc) timed floor_noop_glibc stdin_to "${round_input[tuning]}" "$noop_glibc_bin" ;;
    version) timed floor_version guard VERSION "$version_input" ;;
    written)
      timed floor_written_add cni "$written_guard_bin" ADD "${round_input[written]}"
      timed floor_written_del cni "$written_guard_bin" DEL "${round_input[written]}"
      ;;
    tuning) timed floor_tuning_add tuning ADD "${round_input[tuning]}" ;;
    commit:*) timed "floor_commit_$fs" stdin_to "${round_input[$fs]}" "$commit_bin" "${floor_dir[$fs]}/commit" ;;
    kernel:*) timed "floor_kernel_add_$fs" stdin_to "${round_input[$fs]}" "$kernel_add_bin" "${floor_dir[$fs]}/kernel-add" \
      "$netns_path" "$ifname" "$round" ;;
    guard:*)
      timed "floor_add_$fs" guard ADD "${round_input[$fs]}"
      timed "floor_del_$fs" guard DEL "${round_input[$fs]}"
      again guard "floor_again_$fs" "${round_input[$fs]}" "${floor_dir[$fs]}"
      ;;
    baseline:*)
      timed "floor_base_add_$fs" baseline ADD "${round_input[baseline:$fs]}"
      timed "floor_base_del_$fs" baseline DEL "${round_input[baseline:$fs]}"
      again baseline "floor_base_again_$fs" "${round_input[baseline:$fs]}" "${floor_dir[$fs]}"
      ;;
    esac
  done
done
ip -n "$netns" link show "$ifname" >/dev/null 2>&1 ||
  contract "$ifname left $netns_path during the rounds: the ADDs after that recorded no link facts"
for ((k = 0; k < ${#fs_cases[@]}; k++)); do
  bursts "${fs_cases[k]}_" "$work/mnt-${fs_cases[k]}/state" $(((k + 1) * 100000))
done

# --- Dump over the large store. ---
dump() { "${launcher[@]}" "$(ctl_of "${2:-$guard_bin}")" --dump-checkpoints --state-dir "$large_state" --output "$1"; } # output [plugin]
dumped=$(dump json | jq length) || contract "--dump-checkpoints --output json is not a JSON array"
[[ ${dumped:-0} -eq $LARGE_RECORDS ]] || contract "the JSON dump lists ${dumped:-0} records, the store holds $LARGE_RECORDS"
lines=$(dump table | wc -l) || contract "--dump-checkpoints --output table failed"
((lines >= LARGE_RECORDS)) || contract "the table dump has $lines lines for $LARGE_RECORDS records"
say "timing $DUMP_RUNS dumps of each output over $LARGE_RECORDS records"
for ((run = 0; run < DUMP_RUNS; run++)); do
  timed dump_json dump json
  timed dump_table dump table
  # The baseline's ctl over the same store, in turn with this one's: a change to the dump shows
  # against it in the same minutes, not against another run's figure.
  if [[ -n $baseline_bin ]]; then
    timed baseline_dump_json dump json "$baseline_bin"
    timed baseline_dump_table dump table "$baseline_bin"
  fi
done

# --- 50 hung deferred DELs: the slowest unrelated verb. A delegate-mode store holds HUNG_ENTRIES deferred
# DELs whose primary hangs on every replay (the test primary tests/primaries/recording-plugin, steered by its
# sleep-DEL-<container> files; it stands for a primary whose DEL blocks on a dead API server), all due; then
# HUNG_ROUNDS unrelated pods each get ADD, CHECK, DEL and a STATUS of the network, one exec timed at a time.
# The deferred DELs' sandboxes have no netns (their paths name none): the model primary plumbs nothing.
# The bound (docs/delegate-mode.md): no verb of one pod waits for another pod's primary, at most 0.5 s in all.
hung_state=$work/state-hung hung_primary=$work/hung-primary hung_bin=$work/hung-bin
mkdir -p "$hung_primary" "$hung_bin"
ln -s "$repo/tests/primaries/recording-plugin" "$hung_bin/recording-primary"
hung_call() { # verb container namespace pod [prevResult] -> the guard's answer
  local config='{"cniVersion":"1.1.0","name":"hungnet","type":"sandbox-guard","stateDir":"'$hung_state'","replayTimeoutSeconds":120,"podLockTimeoutSeconds":120'$guard_keys',"delegate":{"type":"recording-primary","stateDir":"'$hung_primary'"}'
  [[ -z ${5:-} ]] || config+=',"prevResult":'$5
  if [[ $1 == STATUS ]]; then
    CNI_COMMAND=STATUS CNI_PATH=$hung_bin "$guard_bin" <<<"$config}" 2>>"$work/hung.log"
  else
    CNI_COMMAND=$1 CNI_CONTAINERID=$2 CNI_NETNS=/run/netns/sgbhung-$$-${2: -12} CNI_IFNAME=$ifname CNI_PATH=$hung_bin \
      CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$3;K8S_POD_NAME=$4;K8S_POD_INFRA_CONTAINER_ID=$2;K8S_POD_UID=uid-$4" \
      "$guard_bin" <<<"$config}" 2>>"$work/hung.log"
  fi
}
hung_answer=''
hung_timed() { # verb container namespace pod [prevResult]: one timed exec, its answer in hung_answer
  local start rc=0
  start=${EPOCHREALTIME/./}
  hung_answer=$(hung_call "$@") || rc=$?
  samples[hung_$1]+="$((${EPOCHREALTIME/./} - start)) "
  ((rc == 0)) || die "an unrelated $1 beside the hung deferred DELs failed (exit $rc): $hung_answer"
}
# The replay workers of the hung store and the primaries they run (each in its own process group): ended
# here, by their ids, or they would hang on for the primary's five minutes.
stop_hung_workers() {
  local fd worker child
  [[ -d ${hung_state:-} ]] || return 0
  for worker in $(for fd in /proc/[0-9]*/fd/*; do
    [[ $(readlink "$fd" 2>/dev/null) == "$hung_state/replay.lock" ]] && { fd=${fd#/proc/}; echo "${fd%%/*}"; }
  done | sort -u); do
    for child in $(ps -o pid= --ppid "$worker"); do kill -9 -- "-$child" 2>/dev/null || kill -9 "$child" 2>/dev/null; done
    kill -9 "$worker" 2>/dev/null
  done
  return 0
}
hung_deferred() { "$(ctl_of "$guard_bin")" --dump-checkpoints --state-dir "$hung_state" --output json | jq '[.[] | select(.status == "deferred")] | length'; }
say "setting up $HUNG_ENTRIES deferred DELs whose primary hangs"
hung_olds=()
for ((n = 0; n < HUNG_ENTRIES; n++)); do
  printf -v old '%064x' $((8000000 + n))
  printf -v new '%064x' $((8100000 + n))
  hung_olds+=("$old")
  old_result=$(hung_call ADD "$old" hung "web-$n") || die "hung setup: ADD of the old sandbox of web-$n failed"
  new_result=$(hung_call ADD "$new" hung "web-$n") || die "hung setup: ADD of the new sandbox of web-$n failed"
  hung_call DEL "$old" hung "web-$n" "$old_result" >/dev/null || die "hung setup: the stale DEL of web-$n failed"
  # The owner's DEL frees the name: its replay is refused, so the entry stays, due after its back-off.
  printf '{"cniVersion":"1.1.0","code":11,"msg":"datastore is locked"}' >"$hung_primary/fail-DEL-$old"
  hung_call DEL "$new" hung "web-$n" "$new_result" >/dev/null || die "hung setup: the owner's DEL of web-$n failed"
done
[[ ! -e $hung_state/replay.lock ]] || flock -w 60 "$hung_state/replay.lock" true || die "hung setup: the replay worker did not finish"
for ((n = 0; n < HUNG_ENTRIES; n++)); do
  rm -f "$hung_primary/fail-DEL-${hung_olds[n]}"
  printf '300.%02d' "$n" >"$hung_primary/sleep-DEL-${hung_olds[n]}"
done
hung_before=$(hung_deferred)
((hung_before == HUNG_ENTRIES)) || contract "the hung setup left $hung_before deferred DELs, not $HUNG_ENTRIES"
sleep 2.2 # past the refused replays' back-off: every entry is due
say "timing $HUNG_ROUNDS unrelated pods' ADD, CHECK, DEL and STATUS beside $HUNG_ENTRIES hung deferred DELs"
for ((round = 0; round < HUNG_ROUNDS; round++)); do
  printf -v cid '%064x' $((8200000 + round))
  # The unrelated pod's sandbox, with the interface the model primary's result names (its CHECK compares
  # the two), made before the clock starts.
  mode_netns[hung$round]=sgbhung-$$-${cid: -12}
  ip netns add "${mode_netns[hung$round]}"
  ip link add "sgbh$round-$$" type veth peer name "$ifname" netns "${mode_netns[hung$round]}"
  ip -n "${mode_netns[hung$round]}" link set "$ifname" address 02:00:00:00:00:01 up
  ip -n "${mode_netns[hung$round]}" addr add 10.22.0.5/24 dev "$ifname"
  hung_timed ADD "$cid" busy "api-$round"
  result=$hung_answer
  hung_timed CHECK "$cid" busy "api-$round" "$result"
  hung_timed STATUS
  hung_timed DEL "$cid" busy "api-$round" "$result"
  ip netns del "${mode_netns[hung$round]}" && unset "mode_netns[hung$round]"
done
hung_after=$(hung_deferred)
((hung_after == HUNG_ENTRIES)) || contract "$HUNG_ENTRIES hung deferred DELs became $hung_after while unrelated verbs ran"
stop_hung_workers

# --- Delegate mode's own cost: the same primary run alone, chained with the guard last, and wrapped by the
# guard (its "delegate" key), each an ADD then a DEL of a fresh attachment in its own netns; every round runs
# the three in a random order. Each goes through the libcni driver (tests/libcni-driver), so the runtime's
# part is libcni's own: chained, libcni execs the primary and then the guard; wrapped, it execs the guard,
# which execs the primary. Run from this script instead, chained mode pays a bash fork for its second
# plugin where libcni pays a vfork: measured that way it came out 2 ms dearer than delegate mode, through
# libcni the same within the noise. The driver's own start, a Go program, is in every row alike.
# The primary is Debian's Go reference `bridge` with `host-local`, as nodes run it (docs/install.md's bridge
# example): it creates and deletes a veth and an IP reservation, so the guard's ADD reads real link facts
# and its delegate does real work. Its DEL swings with the kernel's link teardown, yet on a quiet machine
# the medians of 50-round quarters of one run stay within 0.4 ms of each other (ADD, ~15 ms) and 2 ms (DEL,
# ~26 ms). The calico-cni v1 model, a bash script of about 20 forks a verb, takes 85 ms an ADD and its
# quarters spread by 5 ms; `tuning` cannot come first in a chain (it needs a prevResult); `loopback` gives
# a result no pod is keyed by. The odd/even split in the report says how far one run's difference holds.
if ((DELEGATE_COST)); then
need_packages golang-go golang-github-appc-cni-dev
bash "$repo/scripts/build-libcni-driver.sh" "$work/driver" >/dev/null || die "building the libcni driver failed"
readonly driver=$work/driver/libcni-driver primary_name='bridge + host-local'
delegate_modes=(alone chained delegate)
# With a baseline binary, its delegate mode too, in the same rounds: what this binary's own delegate-mode
# work (the pending-ADD note among it) costs above the baseline's. libcni finds it by its type's name.
[[ -z $baseline_bin ]] || delegate_modes+=(delegate_baseline)
readonly delegate_kind=5
primary_bridge=sgbr$$
declare -A mode_state=([chained]=$work/state-chained [delegate]=$work/state-delegate)
[[ -z $baseline_bin ]] || mode_state[delegate_baseline]=$work/state-delegate-baseline
serial=0
for mode in "${delegate_modes[@]}"; do
  mode_netns[$mode]=sgbench-$$-$mode
  ip netns add "${mode_netns[$mode]}"
  # A network per mode: libcni's cache and host-local's reservations are kept per network name.
  primary='{"type":"bridge","bridge":"'$primary_bridge'","ipam":{"type":"host-local","dataDir":"'$work/ipam'","ranges":[[{"subnet":"100.'$((125 + serial++))'.0.0/16"}]]}}'
  case $mode in
  alone) plugins=$primary ;;
  chained) plugins=$primary',{"type":"sandbox-guard","stateDir":"'${mode_state[$mode]}'"'$guard_keys'}' ;;
  delegate*) plugins='{"type":"sandbox-guard","stateDir":"'${mode_state[$mode]}'"'$guard_keys',"delegate":'$primary'}' ;;
  esac
  printf '{"cniVersion":"1.0.0","name":"%s-%s","plugins":[%s]}\n' "$network" "$mode" "$plugins" >"$work/$mode.conflist"
done
mode_libcni() { # mode verb; the current attachment
  local bin_dir
  bin_dir=$(dirname "$guard_bin")
  [[ $1 != delegate_baseline ]] || bin_dir=$(dirname "$baseline_bin")
  "$driver" -conflist "$work/$1.conflist" -bin-dir "$cni_dir:$bin_dir" -cache-dir "$work/cache" \
    -container-id "$cid" -netns "/run/netns/${mode_netns[$1]}" -ifname "$ifname" \
    -args "K8S_POD_NAMESPACE=$pod_namespace;K8S_POD_NAME=$pod;K8S_POD_INFRA_CONTAINER_ID=$cid;K8S_POD_UID=$uid" "$2"
}
leftovers() { # what DELs should have removed: reservations, libcni's cache, the guard's records
  find "$work/ipam" "$work/cache" "${mode_state[@]/%//records}" \( -type f -o -type l \) ! -name 'last_reserved_ip.*' \
    ! -name lock 2>/dev/null
}

# Preflight: each mode does its real work once, untimed, and gives a result of the same shape. A baseline
# without delegate mode (or one that fails it) is left out of this phase, said so.
if [[ -n $baseline_bin ]]; then
  attachment "$preflight_kind" 3
  if ! out=$(mode_libcni delegate_baseline add 2>&1) || ! mode_libcni delegate_baseline del >/dev/null 2>&1; then
    say "the baseline's delegate mode is left out: its ADD or DEL failed: ${out:0:300}"
    delegate_modes=(alone chained delegate)
  fi
fi
readonly delegate_modes
attachment "$preflight_kind" 2
shapes=()
for mode in "${delegate_modes[@]}"; do
  out=$(mode_libcni "$mode" add 2>&1) || die "$mode ADD with $primary_name failed: $out"
  jq -e --arg ns "/run/netns/${mode_netns[$mode]}" '.interfaces[] | select(.name == "eth0" and .sandbox == $ns)' \
    <<<"$out" >/dev/null || die "$mode ADD returned no eth0 in its netns: $out"
  shapes+=("$(jq -c '[.interfaces[].name | sub("^veth.*"; "veth")], [.ips[].address | split("/")[1]]' <<<"$out")")
  state=${mode_state[$mode]:-}
  [[ -z $state || $(count_records "$state") -eq 1 ]] || contract "$mode ADD wrote no record in $state"
  out=$(mode_libcni "$mode" del 2>&1) || die "$mode DEL with $primary_name failed: $out"
done
[[ ${shapes[1]} == "${shapes[0]}" && ${shapes[2]} == "${shapes[0]}" && ${shapes[3]:-${shapes[0]}} == "${shapes[0]}" ]] ||
  contract "the modes' results differ in shape: ${shapes[*]}"
[[ -z $(leftovers) ]] || contract "a DEL left $(leftovers | head -n 3)"

say "timing $ITERATIONS rounds (+$WARMUP warm-up) of $primary_name: ${delegate_modes[*]}"
for ((round = 0; round < WARMUP + ITERATIONS; round++)); do
  if ((round == WARMUP)); then
    for mode in "${delegate_modes[@]}"; do unset "samples[${mode}_add]" "samples[${mode}_del]"; done
  fi
  attachment "$delegate_kind" "$round"
  shuffled order "${delegate_modes[@]}"
  for mode in "${order[@]}"; do
    timed "${mode}_add" mode_libcni "$mode" add
    timed "${mode}_del" mode_libcni "$mode" del
  done
done
[[ -z $(leftovers) ]] || contract "the rounds left $(leftovers | wc -l) files, e.g. $(leftovers | head -n 1)"
fi

# --- `--restore` of a node's dual-stack pods after a NIC driver reload, this binary beside the baseline.
# Each binary gets a LAN of its own: a veth end in the host as the macvlan master (what a NIC would be), its
# peer in a netns as the router at .1 and ::1, and RESTORE_PODS pods on it, each added by Debian's reference
# macvlan with host-local (a v4 and a v6 range, a default route each), then by that binary (which checkpoints
# its link facts). A run deletes and re-creates the master, which takes every pod's macvlan along as a driver
# reload does, and times `--restore --all` until it returns with every pod back (exit 0). The runs of the two
# alternate in a random order. The IPv6 detection a restore waits for takes 1-2 s whatever the machine's load.
restore_lan() { # label second-octet -> re-creates the label's master and the router end
  local lan=sgrl-$1-$$ n=$2 master=sgrm${1:0:1}$$ uplink=sgru${1:0:1}$$
  ip link del "$master" 2>/dev/null || true
  ip link add "$master" type veth peer name "$uplink" netns "$lan"
  ip link set "$master" up
  ip -n "$lan" addr add "10.$n.0.1/16" dev "$uplink"
  ip -n "$lan" -6 addr add "fd00:$n::1/64" dev "$uplink" nodad
  ip -n "$lan" link set "$uplink" up
}
restore_setup() { # label binary second-octet
  local label=$1 bin=$2 n=$3 pod config result k
  local lan=sgrl-$label-$$ state=$work/restore-state-$label
  restore_netns+=("$lan") restore_masters+=("sgrm${label:0:1}$$")
  ip netns add "$lan"
  restore_lan "$label" "$n"
  config='{"cniVersion":"1.0.0","name":"restorenet-'$label'","type":"macvlan","master":"sgrm'${label:0:1}$$'","mode":"bridge","ipam":{"type":"host-local","dataDir":"'$work/restore-ipam-$label'","ranges":[[{"subnet":"10.'$n'.0.0/16"}],[{"subnet":"fd00:'$n'::/64"}]],"routes":[{"dst":"0.0.0.0/0","gw":"10.'$n'.0.1"},{"dst":"::/0","gw":"fd00:'$n'::1"}]}}'
  for ((k = 0; k < RESTORE_PODS; k++)); do
    pod=sgrp-$label-$k-$$
    restore_netns+=("$pod")
    ip netns add "$pod"
    # The primary waits for its IPv6 detection: the pods are added side by side.
    CNI_COMMAND=ADD CNI_CONTAINERID=$label$k CNI_NETNS=/run/netns/$pod CNI_IFNAME=$ifname CNI_PATH=$cni_dir \
      "$cni_dir/macvlan" <<<"$config" >"$work/restore-result-$label-$k" &
  done
  wait || die "a reference macvlan ADD failed for the $label restore pods"
  for ((k = 0; k < RESTORE_PODS; k++)); do
    result=$(<"$work/restore-result-$label-$k")
    CNI_COMMAND=ADD CNI_CONTAINERID=$label$k CNI_NETNS=/run/netns/sgrp-$label-$k-$$ CNI_IFNAME=$ifname \
      CNI_PATH=$cni_dir CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$pod_namespace;K8S_POD_NAME=restore-$k;K8S_POD_INFRA_CONTAINER_ID=$label$k;K8S_POD_UID=uid-$label-$k" \
      "$bin" <<<'{"cniVersion":"1.0.0","name":"restorenet-'$label'","type":"sandbox-guard","stateDir":"'$state'","prevResult":'"$result"'}' \
      >/dev/null || die "the $label binary's ADD of restore pod $k failed"
  done
}
restore_run() { # label binary second-octet
  local out start
  restore_lan "$1" "$3"
  start=${EPOCHREALTIME/./}
  out=$("$(ctl_of "$2")" --restore --all --state-dir "$work/restore-state-$1" 2>&1) ||
    die "the $1 binary's restore failed: $out"
  samples[restore_$1]+="$((${EPOCHREALTIME/./} - start)) "
  grep -q "$RESTORE_PODS restored" <<<"$out" || die "the $1 binary did not restore $RESTORE_PODS pods: $out"
}
if [[ -n $baseline_bin ]]; then
  say "setting up $RESTORE_PODS dual-stack macvlan pods for each binary's --restore"
  restore_setup guard "$guard_bin" 251
  restore_setup baseline "$baseline_bin" 252
  say "timing $RESTORE_RUNS --restore runs of $RESTORE_PODS dual-stack pods: this binary and the baseline"
  for ((run = 0; run < RESTORE_RUNS; run++)); do
    shuffled order guard baseline
    for who in "${order[@]}"; do
      case $who in
      guard) restore_run guard "$guard_bin" 251 ;;
      baseline) restore_run baseline "$baseline_bin" 252 ;;
      esac
    done
  done
fi

# --- Peak RSS (GNU time's %M, KiB): the highest of RSS_RUNS runs of each. ---
declare -A rss=()
rss_run() { # label command...
  local label=$1 file=$work/rss.$1
  shift
  launcher=(/usr/bin/time -f %M -a -o "$file")
  "$@" >/dev/null || die "$label failed under /usr/bin/time"
  launcher=()
  rss[$label]=$(sort -n "$file" | tail -n 1)
}
say "measuring peak RSS"
for ((run = 0; run < RSS_RUNS; run++)); do
  attachment "$rss_kind" "$run"
  rss_run tuning_version tuning VERSION "$version_input"
  rss_run guard_version guard VERSION "$version_input"
  plugin_config config tuning
  rss_run tuning_add tuning ADD "$config"
  for store in small large; do
    state=${store}_state
    guard_config config "${!state}"
    rss_run "guard_add_$store" guard ADD "$config"
    rss_run "guard_del_$store" guard DEL "$config"
  done
  rss_run dump_json dump json
  rss_run dump_table dump table
done
# The kernel carries the forked GNU time's own RSS into the child's peak across exec: nothing reads lower.
rss_floor=$(/usr/bin/time -f %M /bin/true 2>&1)

# --- Report. ---
percentiles() { # label [awk filter on the sample's round, NR] -> "median p90" in ms
  tr ' ' '\n' <<<"${samples[$1]}" | grep . | awk "${2:-1}" | sort -n | awk '
    { v[NR] = $1 }
    END {
      median = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      p = int(NR * 0.9); if (p < NR * 0.9) p++
      printf "%.3f %.3f\n", median / 1000, v[p] / 1000
    }'
}
declare -A p50=() p90=()
for label in "${!samples[@]}"; do
  read -r "p50[$label]" "p90[$label]" < <(percentiles "$label")
done
calc() { awk "BEGIN { printf \"%.2f\", $* }"; }
holds() { awk "BEGIN { exit !($*) }"; }

failed=0
verdict() { # description condition
  local result=PASS
  holds "$2" || { result=FAIL; failed=1; }
  printf '%s  %s\n' "$result" "$1"
}
version_ratio=$(calc "${p50[guard_version]} / ${p50[tuning_version]}")
add_ratio=$(calc "${p50[guard_add_small]} / ${p50[tuning_add]}")
del_ratio=$(calc "${p50[guard_del_small]} / ${p50[tuning_add]}")
add_del_ratio=$(calc "(${p50[guard_add_small]} + ${p50[guard_del_small]}) / (2 * ${p50[tuning_add]})")
burst_ratio=$(calc "${p50[burst_guard]} / ${p50[burst_tuning]}")
add_growth=$(calc "${p50[guard_add_large]} / ${p50[guard_add_small]}")
del_growth=$(calc "${p50[guard_del_large]} / ${p50[guard_del_small]}")

echo
echo "## Targets"
# Above the exec: what the plugin adds to a pod start, against what one durable commit adds.
above() { calc "${p50[$1]} - ${p50[floor_noop]}"; } # label
commits() { calc "(${p50[$1]} - ${p50[floor_noop]}) / (${p50[floor_commit_$2]} - ${p50[floor_noop]})"; } # label fs
execs() { calc "${p50[$1]} / ${p50[floor_noop]}"; } # label
printf 'INFO  %s\n' "the plugin's exec alone (VERSION, no state): ${p50[floor_version]} ms, $(execs floor_version)x the no-op's exec (reported, not checked)"
for fs in "${floor_fs[@]}"; do
  verdict "ADD on ${floor_name[$fs]}: ${p50[floor_add_$fs]} ms is $(execs "floor_add_$fs")x the no-op's exec, ${p50[floor_noop]} ms (<= $MAX_ADD_EXECS)" \
    "${p50[floor_add_$fs]} <= $MAX_ADD_EXECS * ${p50[floor_noop]}"
  verdict "DEL on ${floor_name[$fs]}: ${p50[floor_del_$fs]} ms is $(execs "floor_del_$fs")x the no-op's exec (<= $MAX_DEL_EXECS)" \
    "${p50[floor_del_$fs]} <= $MAX_DEL_EXECS * ${p50[floor_noop]}"
  verdict "ADD of a pod made again with its address on ${floor_name[$fs]}: ${p50[floor_again_$fs]} ms is $(execs "floor_again_$fs")x the no-op's exec (<= $MAX_ADD_EXECS)" \
    "${p50[floor_again_$fs]} <= $MAX_ADD_EXECS * ${p50[floor_noop]}"
  [[ -z $baseline_bin ]] || printf 'INFO  %s\n' "the baseline on ${floor_name[$fs]}, in the same rounds: ADD ${p50[floor_base_add_$fs]} ms (this binary's $(calc "${p50[floor_add_$fs]} / ${p50[floor_base_add_$fs]}")x), DEL ${p50[floor_base_del_$fs]} ms ($(calc "${p50[floor_del_$fs]} / ${p50[floor_base_del_$fs]}")x), ADD of a pod made again ${p50[floor_base_again_$fs]} ms ($(calc "${p50[floor_again_$fs]} / ${p50[floor_base_again_$fs]}")x) (reported, not checked)"
  printf 'INFO  %s\n' "ADD on ${floor_name[$fs]}: $(above "floor_add_$fs") ms above the exec, $(commits "floor_add_$fs" "$fs")x one commit; DEL $(commits "floor_del_$fs" "$fs")x (reported, not checked)"
  printf 'INFO  %s\n' "ADD's kernel work alone (no parsing) on ${floor_name[$fs]}: $(above "floor_kernel_add_$fs") ms above the exec, $(commits "floor_kernel_add_$fs" "$fs")x one commit (reported, not checked)"
  # About what no parsing, lookup or checksum can go below: this binary's own exec plus ADD's
  # kernel work (the C program makes a subset of ADD's system calls).
  printf 'INFO  %s\n' "the plugin's exec alone (VERSION) plus ADD's kernel work on ${floor_name[$fs]}: $(calc "(${p50[floor_version]} + ${p50[floor_kernel_add_$fs]} - ${p50[floor_noop]}) / ${p50[floor_noop]}")x the no-op's exec, about the least an ADD of this binary could take here (reported, not checked)"
done
printf 'INFO  %s\n' "the same no-op linked against glibc: ${p50[floor_noop_glibc]} ms, $(calc "${p50[floor_noop_glibc]} / ${p50[floor_noop]}")x the floor's; against it, ADD $(calc "${p50[floor_add_base]} / ${p50[floor_noop_glibc]}")x and DEL $(calc "${p50[floor_del_base]} / ${p50[floor_noop_glibc]}")x on ${floor_name[base]} (reported, not checked)"
printf 'INFO  %s\n' "the plugin as an install leaves it, its pages written whole ($written_guard_bin), state on ${floor_name[base]}: ADD ${p50[floor_written_add]} ms ($(calc "${p50[floor_written_add]} / ${p50[floor_add_base]}")x the one read back), DEL ${p50[floor_written_del]} ms ($(calc "${p50[floor_written_del]} / ${p50[floor_del_base]}")x) (reported, not checked)"
verdict "ADD with $LARGE_RECORDS records is ${add_growth}x ADD with $SMALL_RECORDS (<= $MAX_GROWTH_RATIO)" \
  "${p50[guard_add_large]} <= $MAX_GROWTH_RATIO * ${p50[guard_add_small]}"
verdict "DEL with $LARGE_RECORDS records is ${del_growth}x DEL with $SMALL_RECORDS (<= $MAX_GROWTH_RATIO)" \
  "${p50[guard_del_large]} <= $MAX_GROWTH_RATIO * ${p50[guard_del_small]}"
for output in json table; do
  verdict "dump --output $output of $LARGE_RECORDS records ${p50[dump_$output]} ms (<= $MAX_DUMP_MS ms)" \
    "${p50[dump_$output]} <= $MAX_DUMP_MS"
done
for label in guard_version guard_add_small guard_del_small guard_add_large guard_del_large; do
  verdict "peak RSS of $label ${rss[$label]} KiB (<= $MAX_RSS_KIB KiB)" "${rss[$label]} <= $MAX_RSS_KIB"
done
for label in dump_json dump_table; do
  verdict "peak RSS of $label of $LARGE_RECORDS records ${rss[$label]} KiB (<= $MAX_DUMP_RSS_KIB KiB)" \
    "${rss[$label]} <= $MAX_DUMP_RSS_KIB"
done
if [[ -n $baseline_bin ]]; then
  restore_ratio=$(calc "${p50[restore_guard]} / ${p50[restore_baseline]}")
  verdict "--restore of $RESTORE_PODS dual-stack pods ${p50[restore_guard]} ms is ${restore_ratio}x the baseline's ${p50[restore_baseline]} ms (<= $MAX_RESTORE_RATIO)" \
    "${p50[restore_guard]} <= $MAX_RESTORE_RATIO * ${p50[restore_baseline]}"
fi
hung_max() { tr ' ' '\n' <<<"${samples[hung_$1]}" | grep . | sort -n | tail -n 1 | awk '{ printf "%.3f", $1 / 1000 }'; } # verb
for verb in ADD CHECK DEL STATUS; do
  verdict "$verb of an unrelated pod beside $HUNG_ENTRIES hung deferred DELs: max $(hung_max "$verb") ms, median ${p50[hung_$verb]} ms over $HUNG_ROUNDS (<= $MAX_UNRELATED_VERB_MS ms)" \
    "$(hung_max "$verb") <= $MAX_UNRELATED_VERB_MS"
done
if ((${#contract_problems[@]})); then
  failed=1
  echo
  echo "## Contract problems seen"
  printf -- '- %s\n' "${contract_problems[@]}"
fi

echo
echo "## Beside tuning (reported, not checked)"
note() { # description value limit
  printf '%s  %s\n' "$(holds "$2 <= $3" && echo 'below' || echo 'above')" "$1 (the old target: <= $3)"
}
note "ADD median ${p50[guard_add_small]} ms is ${add_ratio}x tuning's no-op ADD ${p50[tuning_add]} ms" "$add_ratio" "$TUNING_ADD_RATIO"
note "DEL median ${p50[guard_del_small]} ms is ${del_ratio}x tuning's no-op ADD" "$del_ratio" "$TUNING_DEL_RATIO"
note "ADD + DEL ${add_del_ratio}x two tuning ADDs" "$add_del_ratio" "$TUNING_ADD_DEL_RATIO"
note "a burst of $BURST ADDs ${p50[burst_guard]} ms is ${burst_ratio}x $BURST tuning ADDs ${p50[burst_tuning]} ms" "$burst_ratio" "$TUNING_BURST_RATIO"
note "VERSION ${p50[guard_version]} ms is ${version_ratio}x tuning's ${p50[tuning_version]} ms" "$version_ratio" "$TUNING_VERSION_RATIO"

row() { # name label ratio
  printf '| %s | %.2f | %.2f | %.2f | %s | %s |\n' "$1" "${p50[$2]}" "${p90[$2]}" \
    "$(calc "${p50[$2]} - ${p50[spawn]}")" "$3" "${rss[$2]:--}"
}
echo
echo "## Results"
echo
echo "$(date -u +%Y-%m-%d), plugin $(stat -c %s "$guard_bin") bytes ($(file -b "$guard_bin" | cut -d, -f1-2)), the operator's sandbox-guard-ctl beside it $(stat -c %s "$(dirname "$guard_bin")/sandbox-guard-ctl" 2>/dev/null || echo '(none)') bytes, $(nproc) cores ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), kernel $(uname -r), state on $fs_type; $ITERATIONS interleaved rounds, $DUMP_RUNS dumps, peak RSS the highest of $RSS_RUNS runs (GNU time, floor $rss_floor KiB). \"Median - spawn\" leaves out the cost of starting any process, which every row pays."
echo
echo "| Case | Median (ms) | p90 (ms) | Median - spawn (ms) | Ratio of medians | Peak RSS (KiB) |"
echo "| --- | ---: | ---: | ---: | --- | ---: |"
row "spawn baseline (\`/bin/true\`)" spawn '-'
row 'tuning VERSION (Go reference)' tuning_version '1.00'
row 'sandbox-guard VERSION' guard_version "$version_ratio x tuning VERSION"
row 'tuning chained no-op ADD (Go reference)' tuning_add '1.00'
row "sandbox-guard ADD, $SMALL_RECORDS records" guard_add_small "$add_ratio x tuning ADD"
row "sandbox-guard DEL, $SMALL_RECORDS records" guard_del_small "$del_ratio x tuning ADD; ADD + DEL $add_del_ratio x two tuning ADDs"
row "sandbox-guard ADD, $LARGE_RECORDS records" guard_add_large "$add_growth x ADD, $SMALL_RECORDS records"
row "sandbox-guard DEL, $LARGE_RECORDS records" guard_del_large "$del_growth x DEL, $SMALL_RECORDS records"
row "\`--dump-checkpoints --output json\`, $LARGE_RECORDS records" dump_json '-'
row "\`--dump-checkpoints --output table\`, $LARGE_RECORDS records" dump_table '-'
[[ -z ${p50[baseline_dump_json]:-} ]] || {
  row "baseline \`--dump-checkpoints --output json\`" baseline_dump_json "this binary's: $(calc "${p50[dump_json]} / ${p50[baseline_dump_json]}")x"
  row "baseline \`--dump-checkpoints --output table\`" baseline_dump_table "this binary's: $(calc "${p50[dump_table]} / ${p50[baseline_dump_table]}")x"
}
row "sandbox-guard ADD that asks the API server (a record of another pod UID)" guard_add_ask "$(calc "${p50[guard_add_ask]} - ${p50[guard_add_small]}") ms above ADD, $SMALL_RECORDS records"
row "sandbox-guard DEL that asks the API server (the owner's)" guard_del_ask "$(calc "${p50[guard_del_ask]} - ${p50[guard_del_small]}") ms above DEL, $SMALL_RECORDS records"
[[ -z ${p50[baseline_add_ask]:-} ]] || {
  row "baseline ADD that asks the API server" baseline_add_ask "this binary's: $(calc "${p50[guard_add_ask]} / ${p50[baseline_add_ask]}")x"
  row "baseline DEL that asks the API server" baseline_del_ask "this binary's: $(calc "${p50[guard_del_ask]} / ${p50[baseline_del_ask]}")x"
}
row "\`sandbox-guard-ctl --get-pod\` alone (exec, kubeconfig, TLS, GET)" ctl_get '-'

echo
echo "50 hung deferred DELs: the slowest unrelated verb. $HUNG_ENTRIES deferred DELs of other pods, all due, whose primary hangs on every replay (tests/primaries/recording-plugin sleeping 300 s); $HUNG_ROUNDS unrelated pods each ADD, CHECK, DEL and a STATUS, delegate mode, one exec timed at a time (ms; target: max <= $MAX_UNRELATED_VERB_MS ms)."
echo
echo "| Verb | Median (ms) | p90 (ms) | Max (ms) |"
echo "| --- | ---: | ---: | ---: |"
for verb in ADD CHECK DEL STATUS; do
  printf '| %s | %.2f | %.2f | %.2f |\n' "$verb" "${p50[hung_$verb]}" "${p90[hung_$verb]}" "$(hung_max "$verb")"
done

if [[ -n $baseline_bin ]]; then
  echo
  echo "Beside the baseline binary ($baseline_bin, $(stat -c %s "$baseline_bin") bytes), in the same rounds: ADD and DEL with $SMALL_RECORDS records; \`--restore --all\` of $RESTORE_PODS dual-stack macvlan pods after their master was re-created (median of $RESTORE_RUNS runs each, alternating)."
  echo
  echo "| Case | Baseline median (ms) | This binary median (ms) | Difference (ms) | Ratio |"
  echo "| --- | ---: | ---: | ---: | --- |"
  for pair in "ADD:baseline_add:guard_add_small" "DEL:baseline_del:guard_del_small" "--restore, $RESTORE_PODS pods:restore_baseline:restore_guard"; do
    IFS=: read -r name old new <<<"$pair"
    printf '| %s | %.2f | %.2f | %+.2f | %s x |\n' "$name" "${p50[$old]}" "${p50[$new]}" "$(calc "${p50[$new]} - ${p50[$old]}")" "$(calc "${p50[$new]} / ${p50[$old]}")"
  done
fi

echo
echo "Bursts of $BURST ADDs of new pods in a row (median of $BURST_RUNS bursts each, the sum of the execs' times, ms; per ADD in brackets):"
echo
echo "| State on | tuning, $BURST no-op ADDs | sandbox-guard, $BURST ADDs | Ratio |"
echo "| --- | ---: | ---: | --- |"
burst_row() { # name label-prefix
  printf '| %s | %.1f (%.2f) | %.1f (%.2f) | %s |
' "$1" "${p50[${2}burst_tuning]}" "$(calc "${p50[${2}burst_tuning]} / $BURST")" \
    "${p50[${2}burst_guard]}" "$(calc "${p50[${2}burst_guard]} / $BURST")" "$(calc "${p50[${2}burst_guard]} / ${p50[${2}burst_tuning]}") x"
}
burst_row "$fs_type ($BENCH_BASE_DIR)" ''
for fs in "${fs_cases[@]}"; do burst_row "$fs, loop-mounted" "${fs}_"; done
echo
echo "The floor ($FLOOR_ROUNDS rounds in a random order, medians, ms): a static no-op exec ${p50[floor_noop]} ms (linked against musl, as the plugin is; against glibc ${p50[floor_noop_glibc]} ms), tuning's no-op ADD ${p50[floor_tuning_add]} ms in the same rounds; \"above\" is the median less the no-op's; one commit = about 700 bytes to a temp file, fdatasync, rename into place, fsync of the directory, by a static C program; ADD's kernel work = a static C program making ADD's system calls (the pod's link facts through netlink in its netns, the lock, the boot id and the store's marker read, the record, the owner and the address entry written as plain files of the guard's sizes, the record linked in from an O_TMPFILE and the others renamed into place, nothing synced; a subset of ADD's calls: none of its lookups of earlier entries) with none of its parsing, reported, not checked. Targets on every file system: ADD <= ${MAX_ADD_EXECS}x, DEL <= ${MAX_DEL_EXECS}x the no-op's exec."
echo
echo "| State on | One commit (above) | ADD's kernel work (above) | ADD (above) | DEL (above) | ADD of a pod made again (above) | ADD's kernel work, commits | ADD, commits | DEL, commits | ADD / tuning ADD | DEL / tuning ADD |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- |"
for fs in "${floor_fs[@]}"; do
  printf '| %s | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) | %s x | %s x | %s x | %s | %s |\n' "${floor_name[$fs]}" \
    "${p50[floor_commit_$fs]}" "$(above "floor_commit_$fs")" "${p50[floor_kernel_add_$fs]}" "$(above "floor_kernel_add_$fs")" \
    "${p50[floor_add_$fs]}" "$(above "floor_add_$fs")" "${p50[floor_del_$fs]}" "$(above "floor_del_$fs")" \
    "${p50[floor_again_$fs]}" "$(above "floor_again_$fs")" \
    "$(commits "floor_kernel_add_$fs" "$fs")" "$(commits "floor_add_$fs" "$fs")" "$(commits "floor_del_$fs" "$fs")" \
    "$(calc "${p50[floor_add_$fs]} / ${p50[floor_tuning_add]}")" "$(calc "${p50[floor_del_$fs]} / ${p50[floor_tuning_add]}")"
done

if ((DELEGATE_COST)); then
echo
echo "## Delegate mode's own cost"
echo
echo "$primary_name as the primary (Debian's reference plugins), each ADD and DEL a fresh attachment in a throwaway netns, run by Debian's libcni as containerd runs a conflist (the driver's own start is in every row); the three ways in each of the same $ITERATIONS interleaved rounds."
echo
echo "| Case | ADD median (ms) | ADD p90 (ms) | DEL median (ms) | DEL p90 (ms) |"
echo "| --- | ---: | ---: | ---: | ---: |"
mode_row() { # name mode
  printf '| %s | %.2f | %.2f | %.2f | %.2f |\n' "$1" "${p50[$2_add]}" "${p90[$2_add]}" "${p50[$2_del]}" "${p90[$2_del]}"
}
difference_row() { # name minuend subtrahend
  printf '| %s | %+.2f | - | %+.2f | - |\n' "$1" "$(calc "${p50[$2_add]} - ${p50[$3_add]}")" "$(calc "${p50[$2_del]} - ${p50[$3_del]}")"
}
mode_row "$primary_name alone" alone
mode_row "chained: $primary_name, then sandbox-guard last" chained
mode_row "delegate: sandbox-guard wrapping $primary_name" delegate
difference_row "**delegate - chained** (difference of medians)" delegate chained
difference_row "sandbox-guard's share, chained (chained - alone)" chained alone
difference_row "sandbox-guard's share, delegate (delegate - alone)" delegate alone
# How far one run's difference can be trusted: the same difference from half the rounds, twice.
half_difference() { # verb parity (NR % 2) [subtrahend mode]
  local delegate other
  read -r delegate _ < <(percentiles "delegate_$1" "NR % 2 == $2")
  read -r other _ < <(percentiles "${3:-chained}_$1" "NR % 2 == $2")
  printf '%+.2f' "$(calc "$delegate - $other")"
}
echo
echo "Delegate - chained from the odd and the even rounds alone: ADD $(half_difference add 1) and $(half_difference add 0) ms, DEL $(half_difference del 1) and $(half_difference del 0) ms."
if [[ " ${delegate_modes[*]} " == *" delegate_baseline "* ]]; then
  echo
  echo "| Case | ADD median (ms) | ADD p90 (ms) | DEL median (ms) | DEL p90 (ms) |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  mode_row "delegate, the baseline binary ($baseline_bin)" delegate_baseline
  difference_row "**delegate - the baseline's delegate** (difference of medians)" delegate delegate_baseline
  echo
  echo "Delegate - the baseline's delegate from the odd and the even rounds alone: ADD $(half_difference add 1 delegate_baseline) and $(half_difference add 0 delegate_baseline) ms, DEL $(half_difference del 1 delegate_baseline) and $(half_difference del 0 delegate_baseline) ms."
fi
fi
exit "$failed"
