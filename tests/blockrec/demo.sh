#!/usr/bin/env bash
# demo.sh: record a small workload on ext4 (and XFS) through blockrec, then
# rebuild the disk at every cut point of the write log and check that no file
# is lost after its fsync returned. Run as root. See README.md.
#
# Env: BLOCKREC=path to a built binary (else built into the temp dir),
#      FSTYPES="ext4 xfs", SUBSET_SEEDS=2 (random unflushed-write subsets
#      tried at every barrier cut), KEEP=1 keeps the temp dir.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" = 0 ] || { echo "demo.sh: must run as root" >&2; exit 2; }

# Mount only in a private mount namespace of our own. A mount namespace another process
# creates (unshare -m) while one of our file systems is mounted copies it: our umount
# then leaves it alive there, `losetup -d` is silently deferred, and when that namespace
# exits the file system writes its last blocks into the image of a later cut (seen here,
# next to a test whose plugin runs under unshare -m). Conversely, drop our copies of
# everyone else's loop and FUSE mounts, so that we do not hold theirs.
if [ -z "${BLOCKREC_DEMO_NS:-}" ]; then
	exec env BLOCKREC_DEMO_NS=1 unshare --mount --propagation private bash "$0" "$@"
fi
awk '$1 ~ "^/dev/loop" || $3 ~ "^fuse" {print $2}' /proc/self/mounts | sort -r |
	while read -r m; do umount -l "$(printf '%b' "$m")" 2>/dev/null || true; done
FSTYPES=${FSTYPES:-ext4 xfs}
SUBSET_SEEDS=${SUBSET_SEEDS:-2}
T0=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/dev/shm}/blockrec-demo.XXXXXX")
LOOPS_BEFORE=$(losetup -a | sort)

# ---- cleanup: every mount, loop device, server and the temp dir ----
MOUNTS=() PIDS=()
cleanup() {
	local rc=$? i
	set +e
	for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
		mountpoint -q "${MOUNTS[i]}" && { umount "${MOUNTS[i]}" || umount -l "${MOUNTS[i]}"; }
	done
	losetup -a | grep -F "$WORK/" | cut -d: -f1 | xargs -r -n1 losetup -d
	for i in "${PIDS[@]}"; do
		kill -TERM "$i" 2>/dev/null || continue
		for _ in $(seq 50); do kill -0 "$i" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$i" 2>/dev/null
		wait "$i" 2>/dev/null
	done
	grep -F "$WORK" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
	if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
	local after ours
	after=$(losetup -a | sort)
	ours=$(grep -cF "$WORK/" <<<"$after" || true)
	echo "losetup -a: $(grep -c . <<<"$LOOPS_BEFORE") entries before, $(grep -c . <<<"$after") after, $ours of ours"
	[ "$ours" = 0 ] || rc=1
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

attach() { REPLY=$(losetup --find --show "$1"); }
detach() { losetup -d "$1"; }
mnt() { mount "$@"; MOUNTS+=("${!#}"); }

if [ -z "${BLOCKREC:-}" ]; then
	(cd "$HERE" && GOCACHE=${GOCACHE:-/var/tmp/blockrec-go/cache} \
		GOMODCACHE=${GOMODCACHE:-/var/tmp/blockrec-go/mod} GOFLAGS=-modcacherw \
		go build -o "$WORK/blockrec" .)
	BLOCKREC=$WORK/blockrec
fi
BR=$BLOCKREC

mkfs_() { # fstype image
	truncate -s 64M "$2"
	case $1 in
	ext4) mkfs.ext4 -q -F "$2" ;;
	# xfsprogs refuses < 300 MiB unless run under fstests; these vars are its override.
	xfs) TEST_DIR=1 TEST_DEV=1 QA_CHECK_FS=1 mkfs.xfs -q -f "$2" ;;
	esac
}
mntopts() { [ "$1" = xfs ] && echo "-o nouuid" || true; }
writes_now() { "$BR" info --log "$1" 2>/dev/null | sed -n 's/^writes=\([0-9]*\).*/\1/p'; }
barriers_now() { "$BR" info --log "$1" 2>/dev/null | sed -n 's/.*barriers=\([0-9]*\).*/\1/p'; }

# serve DIR: start blockrec on DIR/base.img, attach its disk; sets DEV, SPID.
serve() {
	mkdir -p "$1/fuse"
	"$BR" serve --base "$1/base.img" --log "$1/log" --mnt "$1/fuse" 2>"$1/serve.err" &
	SPID=$!
	PIDS+=("$SPID")
	for _ in $(seq 50); do [ -e "$1/fuse/disk" ] && break; sleep 0.1; done
	[ -e "$1/fuse/disk" ] || { cat "$1/serve.err"; exit 1; }
	attach "$1/fuse/disk"
	DEV=$REPLY
}
unserve() { # DEV SPID DIR; sets SERVED to the server's closing line
	detach "$1"
	kill -TERM "$2"
	wait "$2"
	SERVED=$(tail -1 "$3/serve.err")
}

# A python helper: write a file, fsync it, optionally rename it into place, fsync the dir.
PYW='import os,sys
dst, data = sys.argv[1], open(sys.argv[2], "rb").read()
tmp = dst + ".tmp" if len(sys.argv) > 3 else dst
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, data); os.fsync(fd); os.close(fd)
if tmp != dst: os.rename(tmp, dst)
d = os.open(os.path.dirname(dst), os.O_RDONLY); os.fsync(d); os.close(d)'

# ---- ordering probe: do block-layer flushes reach the daemon as FUSE FSYNC? ----
probe() {
	local d=$WORK/probe b0 w0 b1 w1 out=""
	mkdir -p "$d/mnt"
	mkfs_ ext4 "$d/base.img"
	serve "$d"
	b0=$(barriers_now "$d/log") w0=$(writes_now "$d/log")
	python3 -c 'import os,sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for _ in range(5): os.fsync(fd)' "$DEV"
	b1=$(barriers_now "$d/log") w1=$(writes_now "$d/log")
	out+="  fsync(2) on $DEV x5 (no data):         +$((b1 - b0)) barriers, +$((w1 - w0)) writes"$'\n'
	local q="/sys/block/${DEV#/dev/}"
	out+="  $DEV: write_cache=$(cat "$q/queue/write_cache"), fua=$(cat "$q/queue/fua"), dio=$(cat "$q/loop/dio")"$'\n'
	mnt "$DEV" "$d/mnt"
	for opt in barrier nobarrier; do
		mount -o "remount,$opt" "$d/mnt"
		sync -f "$d/mnt"
		b0=$(barriers_now "$d/log") w0=$(writes_now "$d/log")
		python3 -c 'import os,sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
for _ in range(20): os.write(fd, b"x" * 4096); os.fsync(fd)' "$d/mnt/p.$opt"
		b1=$(barriers_now "$d/log") w1=$(writes_now "$d/log")
		out+=$(printf '  ext4 -o %-9s 20 x (write 4K + fsync): +%d barriers, +%d writes' "$opt" $((b1 - b0)) $((w1 - w0)))$'\n'
	done
	umount "$d/mnt"
	unserve "$DEV" "$SPID" "$d"
	PROBE=$out
}

# ---- record a workload; expectations go to DIR/expect as "mark path labels hash[,hash]" ----
record() { # fstype
	local fs=$1 d=$WORK/$1 m
	mkdir -p "$d/mnt" "$d/chk" "$d/src"
	mkfs_ "$fs" "$d/base.img"
	serve "$d"
	m=$d/mnt
	mnt $(mntopts "$fs") "$DEV" "$m"
	head -c 3000 /dev/urandom | base64 >"$d/src/v1"
	head -c 5000 /dev/urandom | base64 >"$d/src/v2"
	head -c 262144 /dev/urandom >"$d/src/synced"
	head -c 262144 /dev/urandom >"$d/src/unsynced"
	head -c 131072 /dev/urandom >"$d/src/dd"
	h() { sha256sum "$d/src/$1" | cut -c1-64; }
	printf '%s\n' "config v1 $(h v1)" "config v2 $(h v2)" "synced.bin ok $(h synced)" \
		"unsynced.bin ok $(h unsynced)" "dd.bin ok $(h dd)" >"$d/known"

	python3 -c "$PYW" "$m/config" "$d/src/v1" rename
	echo "$(writes_now "$d/log") config v1|v2 $(h v1),$(h v2)" >>"$d/expect"
	python3 -c "$PYW" "$m/synced.bin" "$d/src/synced"
	echo "$(writes_now "$d/log") synced.bin ok $(h synced)" >>"$d/expect"
	dd if="$d/src/unsynced" of="$m/unsynced.bin" bs=64k status=none # no fsync
	dd if="$d/src/dd" of="$m/dd.bin" bs=64k conv=fsync status=none
	python3 -c 'import os,sys; d = os.open(sys.argv[1], os.O_RDONLY); os.fsync(d)' "$m"
	echo "$(writes_now "$d/log") dd.bin ok $(h dd)" >>"$d/expect"
	python3 -c "$PYW" "$m/config" "$d/src/v2" rename
	echo "$(writes_now "$d/log") config v2 $(h v2)" >>"$d/expect"

	umount "$m"
	unserve "$DEV" "$SPID" "$d"
}

# ---- check one cut: replay, mount (journal/log recovery), inspect, umount, fsck ----
FAIL=0
check() { # fstype cut [seed]
	local fs=$1 n=$2 seed=${3:-} d=$WORK/$1 state="" p want got lbl fsck=ok mark path lbls hs i=0
	rm -f "$d/cut.img" # a new inode per cut: no stale writer can reach it
	"$BR" replay --base "$d/base.img" --log "$d/log" --upto "$n" --out "$d/cut.img" \
		${seed:+--subset "$seed"} 2>"$d/replay.err"
	[ -n "$seed" ] && DROPPED=$((DROPPED + $(sed -n 's/.*(\([0-9]*\) unflushed dropped).*/\1/p' "$d/replay.err")))
	attach "$d/cut.img"
	if ! mount $(mntopts "$fs") "$REPLY" "$d/chk" 2>"$d/mount.err"; then
		detach "$REPLY"
		echo "  cut $n${seed:+ seed $seed}: MOUNT FAILED: $(cat "$d/mount.err")"
		FAIL=$((FAIL + 1))
		return
	fi
	MOUNTS+=("$d/chk")
	for p in config synced.bin unsynced.bin dd.bin; do
		if [ -f "$d/chk/$p" ]; then
			got=$(sha256sum "$d/chk/$p" | cut -c1-64)
			lbl=$(awk -v p="$p" -v h="$got" '$1 == p && $3 == h {print $2}' "$d/known")
			state+=" $p=${lbl:-other}"
		else
			state+=" $p=absent"
			got=absent
		fi
		eval "GOT_${p//./_}=\$got"
	done
	while read -r mark path lbls hs; do
		i=$((i + 1))
		want=GOT_${path//./_}
		[[ ",$hs," == *",${!want},"* ]] && continue
		[ -z "$seed" ] && LASTBAD[i]=$n
		# Cut N holds the first N writes and the barriers among them, not one
		# right after write N; so a --subset cut may lose the fsync's writes at N == mark.
		if [ "$n" -gt "$mark" ] || { [ -z "$seed" ] && [ "$n" -eq "$mark" ]; }; then
			echo "  LOST: cut $n${seed:+ seed $seed}: $path is ${!want:0:12}, not $lbls, but its fsync returned at write $mark"
			FAIL=$((FAIL + 1))
		fi
	done <"$d/expect"
	umount "$d/chk"
	detach "$REPLY"
	case $fs in
	ext4) e2fsck -fn "$d/cut.img" >"$d/fsck.out" 2>&1 || fsck="FSCK-ERRORS" ;;
	xfs) xfs_repair -n -f "$d/cut.img" >"$d/fsck.out" 2>&1 || fsck="FSCK-ERRORS" ;;
	esac
	if [ "$fsck" != ok ]; then
		echo "  cut $n${seed:+ seed $seed}: $fs check found errors:"; sed 's/^/    /' "$d/fsck.out" | head -20
		FAIL=$((FAIL + 1))
	fi
	STATE="fsck=$fsck$state"
}

run_fs() {
	local fs=$1 d=$WORK/$1 n prev="" checked=0 subsets=0 t0=$SECONDS s i=0 mark path lbls hs
	local -a LASTBAD=()
	DROPPED=0
	record "$fs"
	echo "== $fs: ${SERVED#blockrec: }"
	echo "   log: $("$BR" info --log "$d/log")"
	echo "   state changes along the cuts (cut N = disk holds the first N writes):"
	for n in $("$BR" cuts --log "$d/log"); do
		check "$fs" "$n"
		checked=$((checked + 1))
		[ "$STATE" != "$prev" ] && echo "     cut $n:$STATE" && prev=$STATE
	done
	echo "   expectations (mark = writes logged when the fsync returned; required at every cut >= mark, > mark with --subset):"
	while read -r mark path lbls hs; do
		i=$((i + 1))
		echo "     $path=$lbls: mark $mark, held at every cut from $((${LASTBAD[i]:--1} + 1))"
	done <"$d/expect"
	for n in $("$BR" cuts --log "$d/log" --barriers); do
		for s in $(seq "$SUBSET_SEEDS"); do
			check "$fs" "$n" "$s"
			subsets=$((subsets + 1))
		done
	done
	SUMMARY+="$fs: $("$BR" info --log "$d/log" | cut -d' ' -f1,4), $checked prefix cuts + $subsets random-subset cuts ($DROPPED unflushed writes dropped) checked in $((SECONDS - t0))s"$'\n'
}

SUMMARY=""
probe
echo "== ordering probe (separate ext4 image, not checked):"
printf '%s' "$PROBE"
for fs in $FSTYPES; do
	if ! command -v "mkfs.$fs" >/dev/null; then echo "== $fs: mkfs.$fs not installed, skipped"; continue; fi
	run_fs "$fs"
done

echo "== summary"
printf '%s' "$SUMMARY"
echo "failures (lost synced file, mount or fsck error): $FAIL; total time $(($(date +%s) - T0))s"
[ "$FAIL" = 0 ]
