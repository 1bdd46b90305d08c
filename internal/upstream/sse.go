package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
)

// sseEvent is one server-sent event: its type (empty means "message"), its
// id and its data lines joined with "\n".
type sseEvent struct {
	name string
	id   string
	data []byte
}

// sseReader reads the events of a text/event-stream body as the HTML
// standard defines them (event-stream interpretation), with lines ended by
// "\n" or "\r\n" (the line endings MCP servers use). One event may be at
// most max bytes on the wire.
type sseReader struct {
	r   *bufio.Reader
	max int
	// idBuf is the standard's last event ID buffer, which every id field
	// sets; lastID is the last event ID string, the one to resume from:
	// the buffer as it was when the last event was dispatched (at its
	// blank line, with or without data: a server primes it with an event
	// that has an id and no data). An event the stream is cut inside never
	// sets it. retry is the reconnection time from the last valid retry
	// field, 0 if none.
	idBuf, lastID string
	retry         time.Duration
	// started: the first line was read (and a leading BOM skipped).
	started bool
}

func newSSEReader(r io.Reader, max int) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 16<<10), max: max}
}

// errEventTooLarge says an event exceeded the reader's bound.
var errEventTooLarge = errors.New("server-sent event too large")

// next returns the next event that has data or a type. At the end of the
// stream it returns io.EOF; an event the stream ends in the middle of is
// discarded, as the standard says.
func (s *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	var data []byte
	hasData := false
	size := 0
	for {
		line, err := s.line(s.max - size)
		if err != nil {
			if errors.Is(err, errEventTooLarge) {
				err = fmt.Errorf("%w: more than %d bytes", err, s.max)
			}
			return sseEvent{}, err
		}
		size += len(line)
		if !s.started {
			s.started = true
			line = bytes.TrimPrefix(line, []byte("\xEF\xBB\xBF")) // one leading U+FEFF is ignored
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if len(line) == 0 { // dispatch
			s.lastID = s.idBuf
			if hasData || ev.name != "" {
				ev.data = data
				return ev, nil
			}
			ev, size = sseEvent{}, 0
			continue
		}
		if line[0] == ':' {
			continue // a comment
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			ev.name = string(value)
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				ev.id = string(value)
				s.idBuf = ev.id
			}
		case "retry":
			if ms, err := strconv.ParseUint(string(value), 10, 31); err == nil { // ASCII digits only
				s.retry = time.Duration(ms) * time.Millisecond
			}
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		}
	}
}

// line reads one line, with its terminator, of at most budget bytes. A
// final line without a terminator is io.EOF: it cannot end an event.
func (s *sseReader) line(budget int) ([]byte, error) {
	var buf []byte
	for {
		frag, err := s.r.ReadSlice('\n')
		if len(buf)+len(frag) > budget {
			return nil, errEventTooLarge
		}
		switch {
		case err == nil:
			if buf != nil {
				return append(buf, frag...), nil
			}
			return frag, nil
		case errors.Is(err, bufio.ErrBufferFull):
			buf = append(buf, frag...)
		case errors.Is(err, io.EOF):
			return nil, io.EOF
		default:
			return nil, err
		}
	}
}

// SSEMessages reads the data of the message events of a text/event-stream
// body (events without data, and events of another type, are passed over),
// for a relay that passes them on verbatim.
type SSEMessages struct{ r *sseReader }

// sseBuffers keeps the read buffers of released SSEMessages: a relay reads
// a body per call, and a fresh 16 KiB buffer each time is most of what it
// allocates.
var sseBuffers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

// NewSSEMessages reads r; one event may be at most max bytes on the wire.
// Release gives its buffer back once the body is read.
func NewSSEMessages(r io.Reader, max int) *SSEMessages {
	br := sseBuffers.Get().(*bufio.Reader)
	br.Reset(r)
	return &SSEMessages{r: &sseReader{r: br, max: max}}
}

// Release gives s's buffer back for another body; s reads nothing more.
// The data Next returned stays the caller's.
func (s *SSEMessages) Release() {
	if s.r.r != nil {
		s.r.r.Reset(nil)
		sseBuffers.Put(s.r.r)
		s.r.r = nil
	}
}

// Next returns the next message event's data, or io.EOF at the end of the
// stream.
func (s *SSEMessages) Next() ([]byte, error) {
	if s.r.r == nil {
		return nil, io.EOF
	}
	for {
		ev, err := s.r.next()
		if err != nil {
			return nil, err
		}
		if (ev.name == "" || ev.name == "message") && len(ev.data) > 0 {
			return ev.data, nil
		}
	}
}
