// Package exepages gives back the pages of the gateway's own executable
// that starting it touched and serving does not need.
package exepages

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Stats says what Release did.
type Stats struct {
	Mappings int   // read-only mappings of the executable released
	Bytes    int64 // their resident size before (smaps Rss)
	Skipped  int   // mappings of the executable left alone
	Pieces   int   // mappings the released ones were cut into (split)
}

// mapping is one /proc/self/smaps entry.
type mapping struct {
	start, end uintptr
	perms      string
	dev        string
	inode      uint64
	rss        int64 // bytes
	anon, swap int64 // bytes
	locked     bool
}

// Release drops the resident pages of the executable's read-only,
// file-backed, private mappings (its text and read-only data) from this
// process's page tables with madvise(MADV_DONTNEED), so RSS no longer
// counts what package initialisation and start-up touched; the pages
// stay in the page cache, and those the process uses again come back as
// minor faults.
//
// Why this loses nothing: MADV_DONTNEED on a private file mapping frees
// the process's copies of its pages; a page never written is the file's
// page-cache page, and the next access maps the same bytes again. Only a
// page written since it was mapped (a copy-on-write copy: relocations
// the dynamic loader applied, a debugger's breakpoint) would revert to
// the file's bytes, so a mapping is released only if it cannot be
// written (no w in its permissions) and smaps shows no anonymous and no
// swapped page in it ("Anonymous: 0 kB", "Swap: 0 kB"); the writable
// mappings (.data, .bss, the heap, stacks) are never touched, nor any
// mapping of another file or a locked one. The executable must be the
// file these mappings map: its device and inode are compared with
// /proc/self/exe's.
func Release() (Stats, error) {
	var fi syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &fi); err != nil {
		return Stats{}, fmt.Errorf("release executable pages: stat /proc/self/exe: %w", err)
	}
	st, err := releaseFile(fi.Dev, fi.Ino)
	if err != nil {
		return st, fmt.Errorf("release executable pages: %w", err)
	}
	return st, nil
}

// releaseFile releases the releasable mappings of the file dev, ino.
func releaseFile(dev, ino uint64) (Stats, error) {
	var st Stats
	maps, err := readSmaps("/proc/self/smaps")
	if err != nil {
		return st, err
	}
	devName := fmt.Sprintf("%02x:%02x", unix.Major(dev), unix.Minor(dev))
	// Adjacent releasable mappings (the pieces of an earlier split) are
	// released with one call.
	var runStart, runEnd uintptr
	flush := func() error {
		if runEnd == runStart {
			return nil
		}
		err := madvise(runStart, runEnd, unix.MADV_DONTNEED)
		runStart, runEnd = 0, 0
		return err
	}
	for _, m := range maps {
		if m.inode != ino || m.dev != devName {
			continue
		}
		if !releasable(m) {
			st.Skipped++
			if err := flush(); err != nil {
				return st, err
			}
			continue
		}
		cut, err := split(m.start, m.end, len(maps)+st.Pieces)
		if err != nil {
			return st, err
		}
		if cut {
			st.Pieces += int((m.end - m.start) / uintptr(os.Getpagesize()))
		}
		if runEnd != m.start {
			if err := flush(); err != nil {
				return st, err
			}
			runStart = m.start
		}
		runEnd = m.end
		st.Mappings++
		st.Bytes += m.rss
	}
	return st, flush()
}

// releasable reports whether m is safe to drop: private, never writable,
// no anonymous (copied) or swapped page, not locked.
func releasable(m mapping) bool {
	return len(m.perms) == 4 && m.perms[0] == 'r' && m.perms[1] == '-' && m.perms[3] == 'p' &&
		m.anon == 0 && m.swap == 0 && !m.locked
}

// readSmaps parses the mappings of an smaps file.
func readSmaps(path string) ([]mapping, error) {
	// Streamed: once split, smaps holds ~5,000 entries of ~1 KB.
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if key, _, _ := strings.Cut(line, " "); strings.HasSuffix(key, ":") && key != "Rss:" && key != "Anonymous:" && key != "Swap:" && key != "VmFlags:" {
			continue // a field not needed: not split into words
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping's header line
			m, err := parseHeader(f)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", path, line, err)
			}
			out = append(out, m)
			continue
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("%s: %q before any mapping", path, line)
		}
		m := &out[len(out)-1]
		switch f[0] {
		case "Rss:", "Anonymous:", "Swap:":
			if len(f) != 3 || f[2] != "kB" {
				return nil, fmt.Errorf("%s: %q: want a size in kB", path, line)
			}
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", path, line, err)
			}
			switch f[0] {
			case "Rss:":
				m.rss = kb << 10
			case "Anonymous:":
				m.anon = kb << 10
			default:
				m.swap = kb << 10
			}
		case "VmFlags:":
			for _, fl := range f[1:] {
				m.locked = m.locked || fl == "lo"
			}
		}
	}
	return out, sc.Err()
}

// parseHeader parses "start-end perms offset dev inode [path]".
func parseHeader(f []string) (mapping, error) {
	var m mapping
	if len(f) < 5 {
		return m, fmt.Errorf("want at least 5 fields")
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok {
		return m, fmt.Errorf("want start-end")
	}
	start, err := strconv.ParseUint(lo, 16, 64)
	if err != nil {
		return m, err
	}
	end, err := strconv.ParseUint(hi, 16, 64)
	if err != nil || end <= start {
		return m, fmt.Errorf("bad range %s", f[0])
	}
	ino, err := strconv.ParseUint(f[4], 10, 64)
	if err != nil {
		return m, err
	}
	m.start, m.end, m.perms, m.dev, m.inode = uintptr(start), uintptr(end), f[1], f[3], ino
	return m, nil
}

// split cuts the mapping from start to end into mappings of one page
// each by marking every other page MADV_DONTDUMP (neighbours differ, so
// the kernel cannot merge them again). A page fault maps the page cache
// around the faulting address: since Linux 6.18 all of a large folio (up
// to 2 MiB of a file read or written sequentially, as the executable was
// when it was linked, copied or hashed) if it fits in the mapping, else
// the 64 KiB fault-around window within the mapping. Cut in pages, a
// function the gateway runs brings back its own pages, not the megabyte
// around them: at 8 sessions the gateway's file-backed RSS was ~11 MiB
// with the mappings whole, ~7 with 16 KiB pieces, ~4.5 with pages
// (internal/bench/BENCHMARKS.md). The mark itself changes nothing else: a
// core dump leaves out a private file mapping's pages by default
// (coredump_filter), and the first page, the ELF header a dump does
// keep, is never marked. Each piece is a kernel VMA (~200 bytes of
// kernel memory, ~5,000 for cmcp); split does nothing if that would take
// the process past half of vm.max_map_count.
func split(start, end uintptr, mappings int) (bool, error) {
	page := uintptr(os.Getpagesize())
	if end-start <= page {
		return false, nil // a piece already
	}
	if limit := maxMapCount(); mappings+int((end-start)/page) > limit/2 {
		return false, nil
	}
	for a := start + page; a < end; a += 2 * page {
		if err := madvise(a, a+page, unix.MADV_DONTDUMP); err != nil {
			return false, err
		}
	}
	return true, nil
}

// maxMapCount is vm.max_map_count, or 0 if it cannot be read (then
// nothing is split).
func maxMapCount() int {
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return n
}

// madvise advises the kernel on the memory from start to end. The raw
// call: unix.Madvise wants a []byte, an unsafe conversion of memory Go
// did not allocate.
func madvise(start, end uintptr, advice int) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, start, end-start, uintptr(advice)); e != 0 {
		return fmt.Errorf("madvise %x-%x: %w", start, end, e)
	}
	return nil
}

// KeepEnv is the environment variable that, set to 1, keeps the pages
// (ReleaseFor does nothing).
const KeepEnv = "CMCP_KEEP_EXE_PAGES"

// ReleaseFor calls Release unless environ sets KeepEnv to 1. Any value
// of it but 0, 1 or empty keeps the pages too, with an error saying so.
func ReleaseFor(environ []string) (st Stats, released bool, err error) {
	for _, kv := range environ {
		v, ok := strings.CutPrefix(kv, KeepEnv+"=")
		if !ok {
			continue
		}
		switch v {
		case "", "0":
		case "1":
			return st, false, nil
		default:
			return st, false, fmt.Errorf("%s=%q: want 1 (keep the executable's pages resident) or 0; kept them", KeepEnv, v)
		}
	}
	st, err = Release()
	return st, err == nil, err
}
