package upstream

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// readEvents reads every event of stream, with events of at most max bytes.
func readEvents(stream string, max int) ([]sseEvent, error) {
	r := newSSEReader(strings.NewReader(stream), max)
	var evs []sseEvent
	for {
		ev, err := r.next()
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func TestSSEReader(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		max          int
		want         []string // name|id|data of each event
		tooLarge     bool
	}{
		{name: "go-sdk server", stream: "event: message\nid: 0_1\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"cmcp-1\",\"result\":{}}\n\n",
			want: []string{`message|0_1|{"jsonrpc":"2.0","id":"cmcp-1","result":{}}`}},
		{name: "crlf, comments, two events", stream: ": ping\r\ndata:a\r\n\r\nevent: x\r\ndata: b\r\ndata:  c\r\n\r\n",
			want: []string{"||a", "x||b\n c"}},
		{name: "priming event without data", stream: "id: 7\n\ndata: z\n\n", want: []string{"||z"}},
		{name: "truncated event discarded", stream: "data: a\n\ndata: b\n", want: []string{"||a"}},
		{name: "field without colon", stream: "data\n\n", want: []string{"||"}},
		{name: "event too large", stream: "data: " + strings.Repeat("x", 100) + "\n\n", max: 64, tooLarge: true},
		{name: "many lines too large", stream: strings.Repeat("data: xxxxxxxx\n", 20) + "\n", max: 64, tooLarge: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			max := tc.max
			if max == 0 {
				max = 1 << 20
			}
			evs, err := readEvents(tc.stream, max)
			if tc.tooLarge != errors.Is(err, errEventTooLarge) || (!tc.tooLarge && err != nil) {
				t.Fatalf("err = %v, want too large: %v", err, tc.tooLarge)
			}
			var got []string
			for _, ev := range evs {
				got = append(got, ev.name+"|"+ev.id+"|"+string(ev.data))
			}
			if strings.Join(got, "\n---\n") != strings.Join(tc.want, "\n---\n") {
				t.Fatalf("events %q, want %q", got, tc.want)
			}
		})
	}
}

func FuzzSSEReader(f *testing.F) {
	f.Add("event: message\nid: 0_1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n" +
		"event: message\nid: 0_2\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"cmcp-1\",\"result\":{\"content\":[]}}\n\n")
	f.Add(": c\r\ndata:a\r\ndata\r\n\r\nretry: 10\n\n")
	f.Add("data: " + strings.Repeat("y", 200) + "\n\n")
	f.Fuzz(func(t *testing.T, stream string) {
		const max = 128
		evs, _ := readEvents(stream, max)
		for _, ev := range evs {
			if len(ev.data) > max {
				t.Fatalf("event data of %d bytes from a reader bounded at %d", len(ev.data), max)
			}
		}
		// Data without line breaks, written as one event, reads back.
		data := strings.Map(func(r rune) rune {
			if r == '\n' || r == '\r' {
				return -1
			}
			return r
		}, stream)
		evs, err := readEvents("data: "+data+"\n\n", 1<<20)
		if err != nil || len(evs) != 1 || string(evs[0].data) != data {
			t.Fatalf("round trip of %q: %v %q", data, err, evs)
		}
	})
}

// TestSSEReaderResumeState: every id field sets the last event id, also
// on an event that is not dispatched (a server's priming event), and a
// retry field of ASCII digits sets the reconnection time.
func TestSSEReaderResumeState(t *testing.T) {
	for _, tc := range []struct {
		stream string
		lastID string
		retry  time.Duration
	}{
		{"id: p1\n\n", "p1", 0},
		{"id: p1\nretry: 250\n\n", "p1", 250 * time.Millisecond},
		{"id: a\ndata: x\n\nid: b\n\n", "b", 0},
		{"retry: 100\n\nretry: +5\n\nretry: 1x\n\nretry: -1\n\n", "", 100 * time.Millisecond},
		{"id: a\n\nid: x\x00y\n\n", "a", 0},
	} {
		r := newSSEReader(strings.NewReader(tc.stream), 1<<10)
		for {
			if _, err := r.next(); err != nil {
				break
			}
		}
		if r.lastID != tc.lastID || r.retry != tc.retry {
			t.Errorf("%q: last id %q, retry %v; want %q, %v", tc.stream, r.lastID, r.retry, tc.lastID, tc.retry)
		}
	}
}

// TestSSEReaderSkipsALeadingBOM: the event-stream standard ignores one
// leading U+FEFF.
func TestSSEReaderSkipsALeadingBOM(t *testing.T) {
	evs, err := readEvents("\xEF\xBB\xBFdata: x\n\n", 1<<20)
	if err != nil || len(evs) != 1 || string(evs[0].data) != "x" {
		t.Fatalf("events %+v, err %v; want one event with data x", evs, err)
	}
}
