package upstream

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/upstream/execimage"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestSealedCopyOfAFileChangedAfterItsDigestIsRefused: with sealed: true
// the pin is compared with the digest of the sealed copy's own bytes, not
// with the digest the file had before it was copied. The file is rewritten
// in place between its measurement and the copy: what was copied is not
// the pinned program, so the spawn is refused and the spawn event names
// the digest of the bytes copied. (Comparing the pin with the digest taken
// before the copy survived every test; found in review.)
func TestSealedCopyOfAFileChangedAfterItsDigestIsRefused(t *testing.T) {
	p, pin := writeScript(t, "#!/bin/sh\nexit 4\n")
	tampered := "#!/bin/sh\nexit 9\n"
	execimage.TestHookBeforeSealedCopy = func(path string) {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Error(err)
			return
		}
		f.WriteAt([]byte(tampered), 0)
		f.Close()
	}
	t.Cleanup(func() { execimage.TestHookBeforeSealedCopy = nil })
	var events []SpawnEvent
	hooks := Hooks{Spawn: func(ev SpawnEvent) error { events = append(events, ev); return nil }}
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: pin, InterpreterPin: shPin(t), Sealed: true, StopGrace: time.Second}, os.Environ(), hooks, "per-session")
	if err == nil {
		c.Stop()
		t.Fatalf("a file changed between its digest and its sealed copy was spawned under pin %s", pin)
	}
	if !errors.Is(err, ErrPinMismatch) {
		t.Fatalf("err = %v, want ErrPinMismatch", err)
	}
	if len(events) == 0 || !events[len(events)-1].Refused || !events[len(events)-1].Digest.Equal(digest.Bytes([]byte(tampered))) {
		t.Fatalf("spawn events %+v, want a refusal naming the digest of the bytes copied", events)
	}
}
