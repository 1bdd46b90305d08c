package upstream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// maxFrame bounds one JSON-RPC message read from a child (the go-sdk default).
const maxFrame = 16 << 20

// frameReader reads newline-delimited JSON-RPC objects and fails with a
// *DesyncError on anything else.
type frameReader struct {
	r      *bufio.Reader
	max    int
	offset int64
}

func newFrameReader(r io.Reader, max int) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// Offset is the number of bytes consumed so far.
func (f *frameReader) Offset() int64 { return f.offset }

func (f *frameReader) Read() ([]byte, error) {
	for {
		start := f.offset
		var line []byte
		for {
			chunk, err := f.r.ReadSlice('\n')
			line = append(line, chunk...)
			f.offset += int64(len(chunk))
			if len(line) > f.max {
				return nil, &DesyncError{Offset: start, Excerpt: excerpt(line), Cause: fmt.Errorf("line longer than %d bytes", f.max)}
			}
			if err == nil {
				break
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if err == io.EOF && len(line) > 0 {
				return nil, &DesyncError{Offset: start, Excerpt: excerpt(line), Cause: io.ErrUnexpectedEOF}
			}
			return nil, err
		}
		body := bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(body)) == 0 {
			continue
		}
		trimmed := bytes.TrimSpace(body)
		if trimmed[0] != '{' || !json.Valid(trimmed) {
			return nil, &DesyncError{Offset: start, Excerpt: excerpt(body), Cause: errors.New("not a JSON object")}
		}
		return trimmed, nil
	}
}
