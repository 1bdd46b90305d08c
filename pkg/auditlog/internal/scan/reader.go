package scan

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/tlog"
)

// Entry is one record as read from the log.
type Entry struct {
	Pos   record.Position
	Kind  record.Kind
	Index int64     // seq within the epoch
	Time  time.Time // ts (zero for checkpoint records)
	Hash  tlog.Hash // leaf hash of Line
	Line  []byte    // the exact line, without '\n'
	Body  []byte    // the canonical JSON body

	// decoded ahead (auditlog.VerifyOptions.Decode)
	rec     record.Record
	decErr  error
	decoded bool
}

// Decode returns the typed record (*Call, *Result, *Genesis, ...).
func (e *Entry) Decode() (record.Record, error) {
	r, err := e.rec, e.decErr
	if !e.decoded {
		r, err = record.DecodeBody(e.Kind, e.Body)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.Pos, err)
	}
	return r, nil
}

// Reader iterates over every record of an audit directory in order: epochs
// ascending, segments ascending, lines in file order. It checks each line's
// form (strict canonical JSON with the common members) but not the chain;
// run Verify first when the log is not trusted. An incomplete final line
// (a crash) ends the iteration without error.
type Reader struct {
	dir    string
	epochs []int
	ei     int
	segs   []int
	si     int
	f      *os.File
	br     *bufio.Reader // buf while a segment is open, else nil
	buf    *bufio.Reader // one buffer of readerBuffer bytes for every segment
	off    int64
	no     int64
	file   string // path of segs[si]
}

// NewReader opens the audit directory dir.
func NewReader(dir string) (*Reader, error) {
	epochs, err := logdir.ListEpochs(dir)
	if err != nil {
		return nil, err
	}
	if len(epochs) == 0 {
		return nil, &record.VerifyError{Class: record.ClassNotLog, Pos: record.Position{}, Msg: fmt.Sprintf("%s holds no audit log (no epoch-NNNNNN directories)", dir)}
	}
	return &Reader{dir: dir, epochs: epochs, ei: -1}, nil
}

// Next returns the next record, or io.EOF after the last one.
func (r *Reader) Next() (*Entry, error) {
	for {
		if r.br == nil {
			if err := r.advance(); err != nil {
				return nil, err
			}
			continue
		}
		line, err := r.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: gathered, up to MaxLineBytes.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) && len(long) <= record.MaxLineBytes {
				line, err = r.br.ReadSlice('\n')
				long = append(long, line...)
			}
			if len(long) > record.MaxLineBytes+1 || len(long) == record.MaxLineBytes+1 && long[record.MaxLineBytes] != '\n' {
				return nil, &record.VerifyError{Class: record.ClassIntegrity, Pos: r.pos(), Msg: fmt.Sprintf("line is longer than %d bytes", record.MaxLineBytes)}
			}
			line = long
		}
		if err == io.EOF {
			r.f.Close()
			r.f, r.br = nil, nil
			continue // a final fragment without '\n' is a torn write
		}
		if err != nil {
			return nil, record.IOFailure(r.pos(), err)
		}
		r.no++
		pos := r.pos()
		r.off += int64(len(line))
		line = append([]byte(nil), line[:len(line)-1]...)
		env, err := record.ParseLine(line)
		if err != nil {
			return nil, &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Msg: "malformed record: " + err.Error()}
		}
		pos.Index, pos.Kind = env.Seq, env.Kind
		e := &Entry{Pos: pos, Kind: env.Kind, Index: env.Seq, Hash: tlog.RecordHash(line), Line: line, Body: env.Body}
		if env.TS != nil {
			e.Time, _ = time.Parse(time.RFC3339Nano, string(env.TS))
		}
		return e, nil
	}
}

func (r *Reader) pos() record.Position {
	p := record.Position{Offset: r.off, Line: r.no}
	if r.ei >= 0 && r.ei < len(r.epochs) {
		p.Epoch = r.epochs[r.ei]
		if r.si >= 0 && r.si < len(r.segs) {
			p.File = r.file
		}
	}
	return p
}

// readerBuffer is the Reader's buffer: lines longer than it (up to
// MaxLineBytes) are gathered in a slice of their own, so that reading a
// log of short records costs 64 KiB, not the 4 MiB of the longest line.
const readerBuffer = 64 << 10

// advance opens the next segment file.
func (r *Reader) advance() error {
	for r.ei < 0 || r.si+1 >= len(r.segs) {
		r.ei++
		if r.ei >= len(r.epochs) {
			return io.EOF
		}
		segs, err := logdir.ListSegments(filepath.Join(r.dir, logdir.EpochName(r.epochs[r.ei])))
		if err != nil {
			return record.IOFailure(record.Position{Epoch: r.epochs[r.ei]}, err)
		}
		r.segs, r.si = segs, -1
	}
	r.si++
	r.off, r.no = 0, 0
	r.file = filepath.Join(r.dir, logdir.EpochName(r.epochs[r.ei]), logdir.SegmentName(r.segs[r.si]))
	f, err := logdir.OpenRegular(r.file)
	if err != nil {
		return record.IOFailure(r.pos(), err)
	}
	if r.buf == nil {
		r.buf = bufio.NewReaderSize(f, readerBuffer)
	} else {
		r.buf.Reset(f)
	}
	r.f, r.br = f, r.buf
	return nil
}

// Close releases the open file.
func (r *Reader) Close() error {
	if r.f != nil {
		return r.f.Close()
	}
	return nil
}
