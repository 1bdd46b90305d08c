package exepages

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// residentOf sums the smaps Rss of this process's mappings of the file
// dev, ino that releasable would accept, and of those it would not.
func residentOf(t *testing.T, dev, ino uint64) (readOnly, other int64) {
	t.Helper()
	maps, err := readSmaps("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	devName := devString(dev)
	for _, m := range maps {
		if m.inode != ino || m.dev != devName {
			continue
		}
		if releasable(m) {
			readOnly += m.rss
		} else {
			other += m.rss
		}
	}
	return readOnly, other
}

func devString(dev uint64) string {
	var b bytes.Buffer
	b.WriteString(hex2(unix.Major(dev)))
	b.WriteByte(':')
	b.WriteString(hex2(unix.Minor(dev)))
	return b.String()
}

func hex2(v uint32) string {
	const digits = "0123456789abcdef"
	s := ""
	for v > 0 || len(s) < 2 {
		s = string(digits[v%16]) + s
		v /= 16
	}
	return s
}

// presentPages counts the pages of maps that /proc/self/pagemap shows
// present, into buf (allocated before, so that counting touches no new
// code or data of the executable's beyond this function's).
func presentPages(t *testing.T, fd int, maps []mapping, buf []byte) int {
	n := 0
	for _, m := range maps {
		pages := int(m.end-m.start) / os.Getpagesize()
		b := buf[:8*pages]
		if _, err := syscall.Pread(fd, b, int64(m.start)/int64(os.Getpagesize())*8); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < pages; i++ {
			if b[8*i+7]&0x80 != 0 {
				n++
			}
		}
	}
	return n
}

// TestReleaseDropsTheExecutablesPages: the test binary's own text and
// read-only data, resident after its start, are mostly not resident
// right after Release (pagemap, read without touching them), and the
// process goes on running on pages mapped again from the page cache.
func TestReleaseDropsTheExecutablesPages(t *testing.T) {
	var fi syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &fi); err != nil {
		t.Fatal(err)
	}
	all, err := readSmaps("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var maps []mapping
	var size uintptr
	for _, m := range all {
		if m.inode == fi.Ino && m.dev == devString(fi.Dev) && releasable(m) {
			maps = append(maps, m)
			size = max(size, m.end-m.start)
		}
	}
	pagemap, err := syscall.Open("/proc/self/pagemap", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(pagemap)
	buf := make([]byte, 8*(int(size)/os.Getpagesize()+1))
	before := presentPages(t, pagemap, maps, buf)
	st, err := Release()
	after := presentPages(t, pagemap, maps, buf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("released %d mappings, %d bytes (skipped %d); pages of read-only mappings present: %d before, %d right after", st.Mappings, st.Bytes, st.Skipped, before, after)
	if st.Mappings == 0 || st.Bytes == 0 {
		t.Fatalf("Release released nothing: %+v", st)
	}
	if st.Skipped == 0 {
		t.Errorf("Release skipped no mapping of the executable: its writable data should have been: %+v", st)
	}
	if after >= before/2 {
		t.Errorf("read-only pages of the executable present: %d before Release, %d right after: want under half", before, after)
	}
	runtime.GC() // the collector walks the text's tables again: they come back
	if _, err := Release(); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseKeepsWrittenPages: of one file mapped four ways, a clean
// read-only private mapping is released (its pages read the file's bytes
// again), while a read-only mapping holding a written (copy-on-write)
// page and two writable mappings (one written) are left alone, their bytes intact.
// This is the property that makes Release safe: it never drops a page
// that differs from the file.
func TestReleaseKeepsWrittenPages(t *testing.T) {
	page := os.Getpagesize()
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, bytes.Repeat([]byte{'A'}, 4*page), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fi syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &fi); err != nil {
		t.Fatal(err)
	}
	mmap := func(prot int) []byte {
		b, err := unix.Mmap(int(f.Fd()), 0, 4*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(b) })
		if prot != unix.PROT_READ|unix.PROT_WRITE {
			if err := unix.Mprotect(b, prot); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	clean := mmap(unix.PROT_READ)
	// copied: written once (a copy-on-write page, "Anonymous: 4 kB"),
	// then made read-only, as the dynamic loader leaves relocated data.
	copied, err := unix.Mmap(int(f.Fd()), 0, 4*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(copied) })
	copied[page] = 'B'
	if err := unix.Mprotect(copied, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	writable := mmap(unix.PROT_READ | unix.PROT_WRITE)
	writable[2*page] = 'C'
	// Writable, read but never written: nothing differs from the file
	// yet, but a write could come between smaps and madvise.
	unwritten := mmap(unix.PROT_READ | unix.PROT_WRITE)
	var sum int
	for i := 0; i < len(clean); i += page {
		sum += int(clean[i]) + int(unwritten[i])
	}
	if sum != 8*'A' {
		t.Fatalf("the clean mapping reads %d: want the file's bytes", sum)
	}
	before, _ := residentOf(t, fi.Dev, fi.Ino)
	if before == 0 {
		t.Fatal("the clean mapping is not resident after reading it")
	}

	st, err := releaseFile(fi.Dev, fi.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mappings != 1 || st.Skipped != 3 {
		t.Errorf("released %d mappings and skipped %d: want the clean read-only one released, the written and the two writable ones skipped", st.Mappings, st.Skipped)
	}
	if after, _ := residentOf(t, fi.Dev, fi.Ino); after != 0 {
		t.Errorf("the clean mapping still has %d bytes resident after the release", after)
	}
	if copied[page] != 'B' || copied[0] != 'A' {
		t.Errorf("the read-only mapping with a written page reads %q %q: want B (its written byte) and A", copied[page], copied[0])
	}
	if writable[2*page] != 'C' {
		t.Errorf("the writable mapping's written byte is %q: want C", writable[2*page])
	}
	if !bytes.Equal(clean, bytes.Repeat([]byte{'A'}, 4*page)) {
		t.Error("the released clean mapping no longer reads the file's bytes")
	}
}

// TestReadSmapsRefusesGarbage: a malformed smaps is an error, never a
// guess about which pages may be dropped.
func TestReadSmapsRefusesGarbage(t *testing.T) {
	for name, text := range map[string]string{
		"no header":   "Rss: 4 kB\n",
		"bad range":   "zz-10 r--p 00000000 fe:00 1 /x\n",
		"empty range": "10-10 r--p 00000000 fe:00 1 /x\n",
		"bad size":    "10-20 r--p 00000000 fe:00 1 /x\nAnonymous: many kB\n",
		"bad unit":    "10-20 r--p 00000000 fe:00 1 /x\nSwap: 4 MB\n",
		"short":       "10-20 r--p\n",
	} {
		path := filepath.Join(t.TempDir(), "smaps")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readSmaps(path); err == nil {
			t.Errorf("%s: readSmaps(%q) = nil error", name, text)
		}
	}
}
