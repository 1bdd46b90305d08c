// Package gwtest is the test kit the gateway's, the server assembly's, the
// upstream connections' and the CLI's tests share: a real upstream MCP
// server (RunChild, in modes that inject faults; the program
// internal/gwtest/child, built without -race by BuildChild) and its pin
// (SelfDigest), a gate in
// front of its start (SlowStart), the audit records a test reads back,
// waiting for an event (Eventually, WaitGoroutine), small client helpers
// and a writer safe for a child's output (LockedWriter).
package gwtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// SelfDigest is the path and pin of the test upstream's binary: the
// program internal/gwtest/child (BuildChild), or the test binary itself.
// The binary does not change while the tests run: it is hashed once per
// process (once per harness before).
func SelfDigest(t testing.TB) (string, digest.Digest) {
	t.Helper()
	self.once.Do(func() {
		if self.exe = child.exe; self.exe == "" {
			if self.exe, self.err = os.Executable(); self.err != nil {
				return
			}
		}
		var f *os.File
		if f, self.d, self.err = digest.OpenFile(self.exe); self.err == nil {
			f.Close()
		}
	})
	if self.err != nil {
		t.Fatal(self.err)
	}
	return self.exe, self.d
}

var self struct {
	once sync.Once
	exe  string
	d    digest.Digest
	err  error
}

// LockedWriter collects what is written to it (the first MiB), for logs
// written from several goroutines.
type LockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *LockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *LockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Call calls a tool with a 30 s bound.
func Call(t *testing.T, cs *mcp.ClientSession, name string, args any) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if args == nil {
		args = map[string]any{}
	}
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
}

// WireCode is the JSON-RPC error code of err (0: none).
func WireCode(err error) int64 {
	var we *jsonrpc.Error
	if errors.As(err, &we) {
		return we.Code
	}
	return 0
}

// FirstText is the text of a result's first content item.
func FirstText(r *mcp.CallToolResult) string {
	if r == nil || len(r.Content) == 0 {
		return ""
	}
	if tc, ok := r.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

// Rec is an audit record as a test reads it.
type Rec struct {
	Kind string         `json:"kind"`
	Seq  string         `json:"seq"`
	Body map[string]any `json:"body"`
}

// ReadRecords reads every record in the epochs under dir. The gateway may
// be appending while a test reads: a last line without its newline is a
// record still being written, left for the next read; any whole line that
// is not a record fails the test.
func ReadRecords(t testing.TB, dir string) []Rec {
	t.Helper()
	var out []Rec
	files, _ := filepath.Glob(filepath.Join(dir, "*", "seg-*.jsonl"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for len(b) > 0 {
			line, rest, whole := bytes.Cut(b, []byte("\n"))
			if !whole {
				break // being written
			}
			b = rest
			var r Rec
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, r)
		}
	}
	return out
}

// Kinds are the records of rs of one kind.
func Kinds(rs []Rec, kind string) []Rec {
	var out []Rec
	for _, r := range rs {
		if r.Kind == kind {
			out = append(out, r)
		}
	}
	return out
}

// Eventually polls f until it returns "" or the deadline passes.
func Eventually(t *testing.T, d time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	msg := ""
	for time.Now().Before(deadline) {
		if msg = f(); msg == "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("condition not met after %s: %s", d, msg)
}
