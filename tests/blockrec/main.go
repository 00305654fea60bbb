// Command blockrec records the block-level write log of a file system and
// rebuilds the disk image as it would be after a power cut at any point of
// that log. See README.md.
//
//	blockrec serve  --base IMG --log LOG --mnt DIR
//	blockrec replay --base IMG --log LOG --upto N --out OUT [--subset SEED]
//	blockrec cuts   --log LOG [--barriers]
//	blockrec info   --log LOG
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Log format, little endian. Header: magic[8], base size u64, crc32(base) u32,
// pad u32. Then records: kind u8, pad[3], flags u32, seq u64, off u64, len u64,
// followed by len data bytes for kind 'W' only. seq numbers every record from 1.
const magic = "BLKREC01"

const (
	kWrite   = 'W' // data written at off
	kZero    = 'Z' // off..off+len zeroed (fallocate punch-hole / zero-range)
	kBarrier = 'B' // FSYNC reached the daemon: everything before it is durable
)

type record struct {
	kind   byte
	flags  uint32
	seq    uint64
	off, n uint64
	data   []byte
}

func (r *record) isWrite() bool { return r.kind == kWrite || r.kind == kZero }

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "blockrec: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		die("usage: blockrec serve|replay|cuts|info [flags] (see README.md)")
	}
	fl := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	base := fl.String("base", "", "base image (never modified)")
	logp := fl.String("log", "", "write log")
	mnt := fl.String("mnt", "", "serve: FUSE mount point; the disk appears as DIR/disk")
	upto := fl.Int("upto", -1, "replay: apply the first N write records (-1: all)")
	out := fl.String("out", "", "replay: output image")
	subset := fl.Int64("subset", -1, "replay: seed; writes after the last barrier before N are kept at random (p=1/2)")
	barriers := fl.Bool("barriers", false, "cuts: only the cut points at barriers (and the end)")
	fl.Parse(os.Args[2:])
	need := func(name, v string) {
		if v == "" {
			die("%s: --%s is required", os.Args[1], name)
		}
	}
	need("log", *logp)
	switch os.Args[1] {
	case "serve":
		need("base", *base)
		need("mnt", *mnt)
		serve(*base, *logp, *mnt)
	case "replay":
		need("base", *base)
		need("out", *out)
		replay(*base, *logp, *out, *upto, *subset)
	case "cuts":
		cuts(*logp, *barriers)
	case "info":
		_, recs := readLog(*logp)
		var w, z, b, bytes uint64
		for _, r := range recs {
			switch r.kind {
			case kWrite:
				w++
				bytes += r.n
			case kZero:
				z++
			case kBarrier:
				b++
			}
		}
		fmt.Printf("writes=%d data_writes=%d zero_writes=%d barriers=%d data_bytes=%d\n", w+z, w, z, b, bytes)
	default:
		die("unknown command %q", os.Args[1])
	}
}

// ---- serve ----

type disk struct {
	fs.Inode
	mu   sync.Mutex
	data []byte
	log  *os.File
	seq  uint64
	stat struct{ writes, zeroes, barriers, flushes, reads uint64 }
}

var (
	_ fs.NodeGetattrer = (*disk)(nil)
	_ fs.NodeOpener    = (*disk)(nil)
	_ fs.NodeReader    = (*disk)(nil)
	_ fs.NodeWriter    = (*disk)(nil)
	_ fs.NodeAllocater = (*disk)(nil)
	_ fs.NodeFsyncer   = (*disk)(nil)
	_ fs.NodeFlusher   = (*disk)(nil)
)

// appendRec must be called with d.mu held. Records are written unbuffered,
// so a reader of LOG sees every request answered so far (info on a live log);
// they are made durable (fsync) at barriers and at exit.
func (d *disk) appendRec(kind byte, flags uint32, off, n uint64, data []byte) error {
	d.seq++
	rec := make([]byte, 32, 32+len(data))
	rec[0] = kind
	binary.LittleEndian.PutUint32(rec[4:], flags)
	binary.LittleEndian.PutUint64(rec[8:], d.seq)
	binary.LittleEndian.PutUint64(rec[16:], off)
	binary.LittleEndian.PutUint64(rec[24:], n)
	_, err := d.log.Write(append(rec, data...))
	return err
}

func errno(err error) syscall.Errno {
	if err != nil {
		fmt.Fprintln(os.Stderr, "blockrec: log:", err)
		return syscall.EIO
	}
	return 0
}

func (d *disk) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0600
	out.Nlink = 1
	out.Size = uint64(len(d.data))
	out.Blocks = (out.Size + 511) / 512
	return 0
}

func (d *disk) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, 0
}

func (d *disk) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stat.reads++
	if off >= int64(len(d.data)) {
		return fuse.ReadResultData(nil), 0
	}
	n := copy(dest, d.data[off:]) // copy under the lock: no torn reads
	return fuse.ReadResultData(dest[:n]), 0
}

// Write is called once per FUSE WRITE request. Without the writeback cache the
// kernel sends it synchronously from the writer (the loop worker) and the
// writer's I/O completes only when we reply, so replying after the record is
// appended keeps the log order consistent with completion order.
func (d *disk) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off < 0 || off+int64(len(data)) > int64(len(d.data)) {
		return 0, syscall.ENOSPC // the disk has a fixed size
	}
	copy(d.data[off:], data)
	d.stat.writes++
	return uint32(len(data)), errno(d.appendRec(kWrite, 0, uint64(off), uint64(len(data)), data))
}

// Allocate handles the loop driver's DISCARD (punch hole) and WRITE_ZEROES
// (zero range): both read back as zeroes afterwards, so both are logged as a
// zeroing write. Plain preallocation changes no data and is not logged.
func (d *disk) Allocate(ctx context.Context, f fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	const keepSize, punchHole, zeroRange = 0x01, 0x02, 0x10
	d.mu.Lock()
	defer d.mu.Unlock()
	if mode&^(keepSize|punchHole|zeroRange) != 0 {
		return syscall.EOPNOTSUPP
	}
	end := min(off+size, uint64(len(d.data)))
	if mode&(punchHole|zeroRange) == 0 || off >= end {
		return 0
	}
	clear(d.data[off:end])
	d.stat.zeroes++
	return errno(d.appendRec(kZero, mode, off, end-off, nil))
}

// Fsync is what the loop driver turns a block-layer cache flush into
// (lo_req_flush -> vfs_fsync -> FUSE_FSYNC). The log is made durable before
// we reply, so a barrier seen by the file system is on disk in LOG.
func (d *disk) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stat.barriers++
	if err := d.appendRec(kBarrier, flags, 0, 0, nil); err != nil {
		return errno(err)
	}
	return errno(d.log.Sync())
}

// Flush is sent on close(2) of a file descriptor, not on a durability
// request, so it is counted but not logged.
func (d *disk) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno {
	d.mu.Lock()
	d.stat.flushes++
	d.mu.Unlock()
	return 0
}

type root struct {
	fs.Inode
	d *disk
}

func (r *root) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, r.d, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 2})
	r.AddChild("disk", ch, false)
}

func serve(base, logPath, mnt string) {
	img, err := os.ReadFile(base)
	if err != nil {
		die("%v", err)
	}
	lf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0644)
	if err != nil {
		die("%v", err)
	}
	d := &disk{data: img, log: lf}
	var h [24]byte
	copy(h[:], magic)
	binary.LittleEndian.PutUint64(h[8:], uint64(len(img)))
	binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(img))
	if _, err := lf.Write(h[:]); err != nil {
		die("%v", err)
	}

	opts := &fs.Options{MountOptions: fuse.MountOptions{
		FsName:            "blockrec",
		Name:              "blockrec",
		DirectMountStrict: true, // mount(2) ourselves as root; never fusermount
		// go-fuse never asks for FUSE_WRITEBACK_CACHE unless it is listed in
		// ExtraCapabilities, so writes are sent through synchronously.
	}}
	srv, err := fs.Mount(mnt, &root{d: d}, opts)
	if err != nil {
		die("mount %s: %v", mnt, err)
	}
	fmt.Fprintf(os.Stderr, "blockrec: serving %s/disk (%d bytes), logging to %s\n", mnt, len(img), logPath)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	if err := srv.Unmount(); err != nil {
		// Still busy (e.g. a loop device holds the file): detach lazily and
		// keep serving until the last user lets go.
		fmt.Fprintf(os.Stderr, "blockrec: unmount: %v; detaching lazily\n", err)
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			fmt.Fprintf(os.Stderr, "blockrec: lazy unmount: %v\n", err)
		}
		srv.Wait()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := errors.Join(lf.Sync(), lf.Close()); err != nil {
		die("log: %v", err)
	}
	s := d.stat
	fmt.Fprintf(os.Stderr, "blockrec: done: %d writes, %d zero-ranges, %d barriers (FSYNC), %d FLUSH (close), %d reads\n",
		s.writes, s.zeroes, s.barriers, s.flushes, s.reads)
}

// ---- reading the log ----

func readLog(path string) (size uint64, recs []record) {
	b, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	if len(b) < 24 || string(b[:8]) != magic {
		die("%s: not a blockrec log", path)
	}
	size = binary.LittleEndian.Uint64(b[8:])
	p := 24
	for p+32 <= len(b) {
		r := record{kind: b[p], flags: binary.LittleEndian.Uint32(b[p+4:]),
			seq: binary.LittleEndian.Uint64(b[p+8:]), off: binary.LittleEndian.Uint64(b[p+16:]),
			n: binary.LittleEndian.Uint64(b[p+24:])}
		end := p + 32
		if r.kind == kWrite {
			end += int(r.n)
			if end > len(b) {
				break
			}
			r.data = b[p+32 : end]
		}
		recs = append(recs, r)
		p = end
	}
	if p != len(b) {
		// A log being written (or cut short) ends in a partial record.
		fmt.Fprintf(os.Stderr, "blockrec: %s: ignoring %d trailing bytes of a partial record\n", path, len(b)-p)
	}
	return size, recs
}

func checkBase(path string, img []byte) {
	b, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	if len(b) < 24 || binary.LittleEndian.Uint64(b[8:]) != uint64(len(img)) ||
		binary.LittleEndian.Uint32(b[16:]) != crc32.ChecksumIEEE(img) {
		die("%s was not recorded on top of this base image", path)
	}
}

// ---- replay / cuts ----

func replay(base, logPath, out string, upto int, seed int64) {
	img, err := os.ReadFile(base)
	if err != nil {
		die("%v", err)
	}
	checkBase(logPath, img)
	_, recs := readLog(logPath)

	// The prefix holding the first `upto` writes, and the last barrier in it.
	var prefix []record
	lastBarrier := -1
	n := 0
	for _, r := range recs {
		if upto >= 0 && n == upto {
			break
		}
		if r.kind == kBarrier {
			lastBarrier = len(prefix)
		} else {
			n++
		}
		prefix = append(prefix, r)
	}
	if upto > n {
		die("--upto %d: the log has only %d writes", upto, n)
	}
	var rng *rand.Rand
	if seed >= 0 {
		rng = rand.New(rand.NewPCG(uint64(seed), uint64(n)))
	}
	applied, dropped := 0, 0
	for i, r := range prefix {
		if !r.isWrite() {
			continue
		}
		// A write after the last barrier may still sit in a volatile cache:
		// with --subset it survives the cut with probability 1/2.
		if rng != nil && i > lastBarrier && rng.IntN(2) == 0 {
			dropped++
			continue
		}
		if r.off+r.n > uint64(len(img)) {
			die("record %d writes past the end of the image", r.seq)
		}
		if r.kind == kWrite {
			copy(img[r.off:], r.data)
		} else {
			clear(img[r.off : r.off+r.n])
		}
		applied++
	}
	if err := writeSparse(out, img); err != nil {
		die("%v", err)
	}
	if rng != nil {
		fmt.Fprintf(os.Stderr, "blockrec: replay: applied %d of %d writes (%d unflushed dropped)\n", applied, n, dropped)
	}
}

// writeSparse writes img to path, leaving all-zero 64 KiB chunks as holes.
func writeSparse(path string, img []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0644)
	if err != nil {
		return err
	}
	const chunk = 64 << 10
	var zero [chunk]byte
	for off := 0; off < len(img) && err == nil; off += chunk {
		c := img[off:min(off+chunk, len(img))]
		if !bytes.Equal(c, zero[:len(c)]) {
			_, err = f.WriteAt(c, int64(off))
		}
	}
	if err == nil {
		err = f.Truncate(int64(len(img)))
	}
	return errors.Join(err, f.Close())
}

// cuts prints the values of --upto worth testing, one per line: every write
// count 0..W, or with barriers only the write counts at which a barrier was
// recorded (plus 0 and W).
func cuts(logPath string, barriersOnly bool) {
	_, recs := readLog(logPath)
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	n, last := 0, -1
	emit := func(k int) {
		if k != last {
			fmt.Fprintln(w, k)
			last = k
		}
	}
	emit(0)
	for _, r := range recs {
		if r.kind == kBarrier {
			emit(n)
		} else {
			n++
			if !barriersOnly {
				emit(n)
			}
		}
	}
	emit(n)
}
