package digest

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDirSwappedForAFIFODoesNotHang: a directory swapped for a FIFO
// between its parent's listing and its own open blocked Tree for ever
// (open(2) of a FIFO waits for a writer, and no context can interrupt it;
// found in review). Each walk must end, with a digest or an error.
//
// 20 entries before "sub" keep its listing and its open apart long enough
// for the swapper to land in between: with the open's O_DIRECTORY and
// O_NONBLOCK removed, a walk hung within 0 to 36 iterations in 9 runs (200
// entries: 1 to 15 in 6 runs, at 7 times the cost of each walk; 5
// entries: 0 to 113 in 10), so 500 walks miss that mutation with odds far
// below 1e-20.
func TestDirSwappedForAFIFODoesNotHang(t *testing.T) {
	root := t.TempDir()
	for i := 0; i < 20; i++ {
		os.WriteFile(filepath.Join(root, "f"+string(rune('a'+i%26))+string(rune('a'+i/26))), []byte("x"), 0o644)
	}
	sub := filepath.Join(root, "sub")
	os.Mkdir(sub, 0o755)
	alt := filepath.Join(root, "zfifo")
	if err := syscall.Mkfifo(alt, 0o644); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for !stop.Load() {
			unix.Renameat2(unix.AT_FDCWD, sub, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE)
		}
	}()
	// The swapper ends before TempDir's cleanup removes the tree: a swap
	// during RemoveAll fails it ("unlinkat .../zfifo: not a directory").
	defer func() { stop.Store(true); <-swapped }()
	for i := 0; i < 500; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		done := make(chan error, 1)
		go func() { _, err := Tree(ctx, root, TreeOptions{}); done <- err }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cancel()
			select {
			case <-done:
			case <-time.After(3 * time.Second):
				t.Fatalf("Tree hung on iteration %d and ignored its context's cancellation", i)
			}
		}
		cancel()
	}
}
