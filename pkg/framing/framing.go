// Package framing reads the stdio wire of MCP: newline-delimited JSON-RPC
// 2.0, one message per line, as the gateway reads its stdio upstreams. The
// reader is strict: a line that is not exactly one JSON-RPC 2.0 object (a
// batch, a log line, a partial or oversized message) is a fatal
// *DesyncError that carries the byte offset and an excerpt safe to log, and
// the Reader never resynchronises. A message is written as its bytes and a
// newline, with no line break inside (internal/upstream refuses to send one
// that holds any). This package does no network I/O.
package framing

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// DefaultMaxSize is a reasonable maximum message size (4 MiB) for NewReader.
const DefaultMaxSize = 4 << 20

// ErrDesync matches (errors.Is) every *DesyncError.
var ErrDesync = errors.New("framing desync")

// ErrTooLarge matches (errors.Is) the *DesyncError of a message longer than
// the Reader's maximum size.
var ErrTooLarge = errors.New("message too large")

// excerptLen is how many bytes of an offending line a DesyncError keeps.
const excerptLen = 48

// DesyncError reports a line that is not exactly one JSON-RPC 2.0 message.
// The stream cannot be trusted after it: stop reading and close the peer.
type DesyncError struct {
	Offset  int64  // byte offset in the stream where the offending line starts
	Line    int64  // 1-based line number
	Reason  string // what is wrong with the line
	Excerpt string // the line's first bytes, Go-quoted ASCII (no control characters), "..." if cut
	Err     error  // ErrTooLarge, io.ErrUnexpectedEOF or nil
}

func (e *DesyncError) Error() string {
	return fmt.Sprintf("framing desync at byte %d (line %d): %s; the line starts %s", e.Offset, e.Line, e.Reason, e.Excerpt)
}

// Is makes errors.Is(err, ErrDesync) true.
func (e *DesyncError) Is(target error) bool { return target == ErrDesync }

// Unwrap returns ErrTooLarge, io.ErrUnexpectedEOF or nil.
func (e *DesyncError) Unwrap() error { return e.Err }

// Excerpt quotes the first bytes of line so that it is safe to write to a
// log or terminal: ASCII only, control characters and invalid UTF-8 escaped.
func Excerpt(line []byte) string {
	cut := len(line) > excerptLen
	if cut {
		line = line[:excerptLen]
		// Do not split a UTF-8 sequence into escaped garbage.
		for i := 0; i < utf8.UTFMax && len(line) > 0 && !utf8.Valid(line); i++ {
			line = line[:len(line)-1]
		}
	}
	q := strconv.QuoteToASCII(string(line))
	if cut {
		q += "..."
	}
	return q
}

// Reader reads newline-delimited JSON-RPC 2.0 messages. It is not safe for
// concurrent use; one goroutine owns a stream.
type Reader struct {
	br   *bufio.Reader
	max  int
	off  int64 // offset of the next line
	line int64 // number of lines read
	buf  bytes.Buffer
	dec  jsontext.Decoder
	err  error // sticky: once desynchronised, always desynchronised
	// AllowInvalidUTF8, if set, lets through a line that is a JSON-RPC
	// message but for text that is not UTF-8 (bytes that are not, or a
	// lone surrogate escape), for the caller to decide about: such text
	// can fail the one message without desynchronising the stream.
	AllowInvalidUTF8 bool
}

// NewReader returns a Reader of r that refuses messages longer than maxSize
// bytes (not counting the newline); maxSize <= 0 means DefaultMaxSize.
func NewReader(r io.Reader, maxSize int) *Reader {
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	size := pooledSize
	if maxSize+1 < size {
		size = maxSize + 1
	}
	if size < 16 {
		size = 16
	}
	if size == pooledSize {
		br := readers.Get().(*bufio.Reader)
		br.Reset(r)
		return &Reader{br: br, max: maxSize}
	}
	return &Reader{br: bufio.NewReaderSize(r, size), max: maxSize}
}

// pooledSize is the size of the read buffers that Release gives back for
// later Readers: a stream per child process, one child per session,
// would otherwise allocate (and clear) 64 KiB at every new session.
const pooledSize = 64 << 10

var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, pooledSize) }}

// errReleased is what Read returns after Release.
var errReleased = errors.New("framing: read after Release")

// Release gives the Reader's read buffer back for reuse by later Readers,
// once its stream is done with; Read then fails. The messages Read
// returned are copies and stay valid.
func (r *Reader) Release() {
	br := r.br
	if br == nil {
		return
	}
	r.br, r.err = nil, errReleased
	if br.Size() == pooledSize {
		br.Reset(nil)
		readers.Put(br)
	}
}

// Offset returns the byte offset of the next line in the stream.
func (r *Reader) Offset() int64 { return r.off }

// Read returns the next message, a JSON object with "jsonrpc":"2.0" that is
// a request, notification or response, as it appeared on the line (without
// the newline). It returns io.EOF at the end of the stream after a complete
// line, and a *DesyncError (errors.Is(err, ErrDesync)) for anything else;
// after an error every call returns the same error. Other errors come from
// the underlying reader.
func (r *Reader) Read() (json.RawMessage, error) {
	if r.err != nil {
		return nil, r.err
	}
	r.buf.Reset()
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.buf.Write(chunk)
		n := r.buf.Len()
		if n > 0 && r.buf.Bytes()[n-1] == '\n' {
			n--
		}
		if n > r.max {
			r.buf.Truncate(min(r.buf.Len(), excerptLen+utf8.UTFMax))
			return nil, r.fail(fmt.Sprintf("message longer than the maximum of %d bytes", r.max), ErrTooLarge)
		}
		if err == nil {
			break
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF {
			if r.buf.Len() == 0 {
				r.err = io.EOF
				return nil, io.EOF
			}
			return nil, r.fail("the stream ended in the middle of a line (no final newline)", io.ErrUnexpectedEOF)
		}
		r.err = err
		return nil, err
	}
	line := r.buf.Bytes()[:r.buf.Len()-1]
	if reason := r.check(&r.buf); reason != "" {
		return nil, r.failLine(reason, nil, line)
	}
	msg := make(json.RawMessage, len(line))
	copy(msg, line)
	r.off += int64(len(line)) + 1
	r.line++
	return msg, nil
}

func (r *Reader) fail(reason string, err error) error {
	return r.failLine(reason, err, r.buf.Bytes())
}

func (r *Reader) failLine(reason string, err error, line []byte) error {
	if n := len(line); n > 0 && line[n-1] == '\n' {
		line = line[:n-1]
	}
	r.err = &DesyncError{Offset: r.off, Line: r.line + 1, Reason: reason, Excerpt: Excerpt(line), Err: err}
	return r.err
}

var (
	nameJSONRPC = []byte(`"jsonrpc"`)
	nameMethod  = []byte(`"method"`)
	nameID      = []byte(`"id"`)
	nameResult  = []byte(`"result"`)
	nameError   = []byte(`"error"`)
	version20   = []byte(`"2.0"`)
)

// check returns why the line in src (with its newline) is not exactly one
// JSON-RPC 2.0 object, or "". It consumes src.
func (r *Reader) check(src *bytes.Buffer) string {
	if src.Len() <= 1 {
		return "empty line"
	}
	// The decoder reads a *bytes.Buffer in place, without copying; the
	// newline is trailing whitespace to it.
	if r.AllowInvalidUTF8 {
		r.dec.Reset(src, jsontext.AllowInvalidUTF8(true))
	} else {
		r.dec.Reset(src)
	}
	switch k := r.dec.PeekKind(); k {
	case '{':
	case '[':
		return "a JSON array (batch); JSON-RPC batches are refused"
	case 0:
		_, err := r.dec.ReadToken()
		return "not JSON: " + syntaxReason(err)
	default:
		return "a JSON " + kindName(k) + ", not a JSON-RPC object"
	}
	if _, err := r.dec.ReadToken(); err != nil {
		return "not JSON: " + syntaxReason(err)
	}
	var jsonrpc, method, id, result, errField bool
	for r.dec.PeekKind() != '}' {
		name, err := r.dec.ReadValue()
		if err != nil {
			return "invalid JSON: " + syntaxReason(err)
		}
		if bytes.IndexByte(name, '\\') >= 0 {
			if u, err := jsontext.AppendUnquote(nil, name); err == nil {
				name = jsontext.Value(strconv.AppendQuote(nil, string(u)))
			}
		}
		kind := r.dec.PeekKind()
		switch {
		case bytes.Equal(name, nameJSONRPC):
			v, err := r.dec.ReadValue()
			if err != nil {
				return "invalid JSON: " + syntaxReason(err)
			}
			if !bytes.Equal(v, version20) {
				return `"jsonrpc" is not "2.0"`
			}
			jsonrpc = true
			continue
		case bytes.Equal(name, nameMethod):
			if kind != '"' {
				return `"method" is not a string`
			}
			method = true
		case bytes.Equal(name, nameID):
			if kind != '"' && kind != '0' && kind != 'n' {
				return `"id" is not a string, number or null`
			}
			id = true
		case bytes.Equal(name, nameResult):
			result = true
		case bytes.Equal(name, nameError):
			if kind != '{' {
				return `"error" is not an object`
			}
			errField = true
		}
		if err := r.dec.SkipValue(); err != nil {
			return "invalid JSON: " + syntaxReason(err)
		}
	}
	if _, err := r.dec.ReadToken(); err != nil {
		return "invalid JSON: " + syntaxReason(err)
	}
	if _, err := r.dec.ReadToken(); err != io.EOF {
		if err == nil {
			return "more than one JSON value on the line"
		}
		return "invalid JSON after the object: " + syntaxReason(err)
	}
	switch {
	case !jsonrpc:
		return `no "jsonrpc":"2.0" member`
	case method && (result || errField):
		return `both "method" and "result"/"error"`
	case method:
		return ""
	case !id:
		return `neither "method" nor "id": not a request, notification or response`
	case result == errField:
		return `a response needs exactly one of "result" and "error"`
	}
	return ""
}

func syntaxReason(err error) string {
	if err == nil {
		return "unexpected end"
	}
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return "unexpected end of the line"
	}
	var se *jsontext.SyntacticError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d of the line)", se.Err, se.ByteOffset)
	}
	return err.Error()
}

func kindName(k jsontext.Kind) string {
	switch k {
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "value"
}
