package httpfront

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// writeStallChunk is the most a single write of a POST's response puts
// on the connection under one deadline.
const writeStallChunk = 16 << 10

// stallWriter bounds the writes of one POST's response: before every
// piece of at most writeStallChunk bytes, and every flush, the connection's
// write deadline is set limit ahead, so a write fails once the agent has
// read nothing for that long (http.Server has no WriteTimeout: it would
// cut GET streams and long calls). Between writes a past deadline does
// no harm: the next write sets a new one. finish sets it once more for
// what net/http writes after the handler (the rest of the buffer, the
// last chunk), and the server clears it for the next request.
type stallWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	limit time.Duration
	// failed is why a write failed, if one did (read by the fast path,
	// whose result record says the answer was not delivered).
	failed string
}

func newStallWriter(w http.ResponseWriter, limit time.Duration) *stallWriter {
	return &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), limit: limit}
}

func (w *stallWriter) arm() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.limit)) }

func (w *stallWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), writeStallChunk)
		w.arm()
		m, err := w.ResponseWriter.Write(p[:c])
		n += m
		if err != nil {
			w.fail(err)
			return n, err
		}
		p = p[c:]
	}
	return n, nil
}

// FlushError is the flush http.ResponseController uses.
func (w *stallWriter) FlushError() error {
	w.arm()
	err := w.rc.Flush()
	if err != nil {
		w.fail(err)
	}
	return err
}

func (w *stallWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the connection's other
// controls (the read deadline).
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *stallWriter) fail(err error) {
	if w.failed != "" {
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		w.failed = fmt.Sprintf("the agent read nothing of it for %s, and its connection was closed", w.limit)
		return
	}
	w.failed = fmt.Sprintf("writing it to the agent failed: %v", err)
}

func (w *stallWriter) finish() { w.arm() }
