package framing

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
)

// cycle repeats a stream forever.
type cycle struct {
	data []byte
	off  int
}

func (c *cycle) Read(p []byte) (int, error) {
	n := copy(p, c.data[c.off:])
	c.off = (c.off + n) % len(c.data)
	return n, nil
}

var benchStream = []byte(strings.Join(realMessages, "\n") + "\n")

// BenchmarkReader reads one message per op from a real MCP session,
// repeated: ns/op is per message, allocs/op is allocations per message.
func BenchmarkReader(b *testing.B) {
	r := NewReader(&cycle{data: benchStream}, 0)
	b.SetBytes(int64(len(benchStream) / len(realMessages)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Read(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkReaderBaseline is the naive reader for comparison, measured in
// the same run: bufio.Scanner lines checked with json.Valid (no JSON-RPC
// checks, no duplicate-name or batch refusal, no copy of the message).
func BenchmarkReaderBaseline(b *testing.B) {
	sc := bufio.NewScanner(&cycle{data: benchStream})
	sc.Buffer(make([]byte, 64<<10), DefaultMaxSize)
	b.SetBytes(int64(len(benchStream) / len(realMessages)))
	b.ReportAllocs()
	for b.Loop() {
		if !sc.Scan() || !json.Valid(sc.Bytes()) {
			b.Fatal("scan")
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
