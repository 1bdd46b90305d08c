// Package scan reads an audit log's files: Epoch verifies one epoch
// directory (its segments in order, parsed and hashed on all cores: the
// chain, the kinds' places, the genesis, every checkpoint's signature and
// root, the segment records), and the Reader iterates over every record
// of a directory. Package auditlog builds on it (the writer's crash
// recovery, Verify, proofs, receipts); it never imports auditlog.
package scan

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/jcs"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/merkle"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// rawLine is one line of a segment with what the workers computed for it.
type rawLine struct {
	line    []byte // without '\n'
	off     int64
	no      int64
	torn    bool // final fragment without '\n'
	tooLong bool
	env     record.Envelope
	hash    tlog.Hash
	perr    error
	// With Options.OnRecord only:
	ts      time.Time
	rec     record.Record // decoded body, if Options.Decode selected its kind
	decErr  error
	decoded bool
}

type lineBatch struct {
	seg      int
	file     string
	lines    []rawLine
	ioErr    error
	fileDone bool
	fileSum  []byte
	ready    chan struct{}
}

const chunkSize = 4 << 20

// streamLines reads the segments of an epoch in order and parses and hashes
// their lines on all cores. Batches arrive on the returned channel in file
// order; each is usable after its ready channel is closed. Closing stop
// ends the stream early.
func streamLines(epochDir string, segs []int, stop <-chan struct{}, opt *Options) <-chan *lineBatch {
	out := make(chan *lineBatch, 16)
	work := make(chan *lineBatch, 16)
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				for i := range b.lines {
					l := &b.lines[i]
					if l.torn || l.tooLong {
						continue
					}
					l.env, l.perr = record.ParseLine(l.line)
					l.hash = tlog.RecordHash(l.line)
					if opt.OnRecord != nil && l.perr == nil {
						if l.env.TS != nil {
							l.ts, _ = time.Parse(time.RFC3339Nano, string(l.env.TS))
						}
						if opt.Decode != nil && opt.Decode(l.env.Kind) {
							l.rec, l.decErr = record.DecodeBody(l.env.Kind, l.env.Body)
							l.decoded = true
						}
					}
				}
				close(b.ready)
			}
		}()
	}
	send := func(b *lineBatch) bool {
		select {
		case out <- b:
		case <-stop:
			return false
		}
		select {
		case work <- b:
		case <-stop:
			return false
		}
		return true
	}
	go func() {
		defer close(out)
		defer func() { close(work); wg.Wait() }()
		for _, n := range segs {
			path := filepath.Join(epochDir, logdir.SegmentName(n))
			if !readSegment(n, path, n != segs[len(segs)-1], send) {
				return
			}
		}
	}()
	return out
}

// readSegment splits one segment file into batches of lines.
// The whole file is hashed only when hashFile is set (a later segment
// record names its hash).
func readSegment(seg int, path string, hashFile bool, send func(*lineBatch) bool) bool {
	newBatch := func() *lineBatch {
		return &lineBatch{seg: seg, file: path, ready: make(chan struct{})}
	}
	fail := func(err error) bool {
		b := newBatch()
		b.ioErr = err
		send(b)
		return false
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0) // a FIFO must not block: refused below
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if !fi.Mode().IsRegular() {
		what := "a directory"
		if !fi.IsDir() {
			what = "a " + fi.Mode().Type().String() + " file"
		}
		return fail(fmt.Errorf("the segment is not a regular file: it is %s", what))
	}
	sum := sha256.New()
	var carry []byte
	var off, no int64
	// A chunk holds the rest of the file as Stat saw it (one more byte to
	// meet its end in the same read), up to chunkSize: a 64 KiB segment
	// does not cost a 4 MiB buffer to clear. A file that grew meanwhile
	// is read on in further chunks.
	size, read := fi.Size(), int64(0)
	for {
		chunk := int64(chunkSize)
		if rest := size - read + 1; rest < chunk {
			chunk = max(rest, 4<<10)
		}
		buf := make([]byte, len(carry), len(carry)+int(chunk))
		copy(buf, carry)
		n, rerr := io.ReadFull(f, buf[len(carry):cap(buf)])
		read += int64(n)
		buf = buf[:len(carry)+n]
		if hashFile {
			sum.Write(buf[len(carry):])
		}
		eof := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		if rerr != nil && !eof {
			return fail(fmt.Errorf("read %s: %w", path, rerr))
		}
		b := newBatch()
		b.lines = make([]rawLine, 0, bytes.Count(buf, []byte{'\n'})+1)
		carry, off, no = b.appendLines(buf, off, no)
		if len(carry) > record.MaxLineBytes {
			no++
			b.lines = append(b.lines, rawLine{line: carry[:256], off: off, no: no, tooLong: true})
			if !send(b) {
				return false
			}
			return true // the verifier stops at this line
		}
		if eof {
			if len(carry) > 0 {
				no++
				b.lines = append(b.lines, rawLine{line: carry, off: off, no: no, torn: true})
			}
			b.fileDone = true
			b.fileSum = sum.Sum(nil)
			return send(b)
		}
		if len(b.lines) > 0 && !send(b) {
			return false
		}
	}
}

// appendLines appends to b the complete lines of buf, which starts at
// offset off of the file after line no, and returns what follows its last
// line break with the offset and number of the line that starts it.
func (b *lineBatch) appendLines(buf []byte, off, no int64) ([]byte, int64, int64) {
	rest := buf
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return rest, off, no
		}
		no++
		b.lines = append(b.lines, rawLine{line: rest[:i], off: off, no: no})
		if i > record.MaxLineBytes {
			b.lines[len(b.lines)-1].tooLong = true
			b.lines[len(b.lines)-1].line = rest[:256]
		}
		off += int64(i + 1)
		rest = rest[i+1:]
	}
}

// Options control Epoch.
type Options struct {
	Trusted    map[string]bool                 // nil: trust the genesis key (reported by the caller)
	WantRoots  map[string]map[int64]*tlog.Hash // by origin: sizes whose roots to keep
	KeepLeaves bool
	Progress   func(bytes int64)
	Evidence   func(g *record.Genesis) error
	// tolerateTail: in the last segment, report an error after the last
	// checkpoint as a cuttable tail instead of failing (writer recovery).
	TolerateTail bool
	OnRecord     func(e *Entry) error      // see auditlog.VerifyOptions.OnRecord
	Decode       func(k record.Kind) bool  // see auditlog.VerifyOptions.Decode
	OnLeaf       func(h tlog.Hash)         // every record's leaf hash, in order
	OnCheckpoint func(cp *c2sp.Checkpoint) // every checkpoint that verified, in order
	Detail       *Detail                   // if set, filled in (on error too)
}

// EpochResult is what verifying one epoch established.
type EpochResult struct {
	Epoch            int              `json:"epoch"`
	Dir              string           `json:"dir"`
	Origin           string           `json:"origin"`
	Key              string           `json:"key"`
	Genesis          *record.Genesis  `json:"-"`
	Segments         int              `json:"segments"`
	Records          int64            `json:"records"`
	Checkpoints      int              `json:"checkpoints"`
	LastCheckpoint   *c2sp.Checkpoint `json:"-"`
	LastCheckpointAt int64            `json:"last_checkpoint_index"` // index of the last checkpoint record, -1 if none
	Unsealed         int64            `json:"unsealed"`              // records after the last checkpoint
	// Signed is the number of records up to and including the last
	// checkpoint (Records - Unsealed): the ones it signs, and itself.
	// SignedFirst and SignedLast are the times of the first and the last
	// record its tree covers (zero without a checkpoint).
	Signed                  int64            `json:"signed"`
	SignedFirst, SignedLast time.Time        `json:"-"`
	Sealed                  bool             `json:"sealed"`     // ended with seal + final checkpoint
	TornBytes               int64            `json:"torn_bytes"` // incomplete final line (crash)
	TornAt                  *record.Position `json:"torn_at,omitempty"`
	First, Last             time.Time        `json:"-"`
	Root                    tlog.Hash        `json:"-"`
	Recovery                *record.Recovery `json:"-"` // recovery record in this epoch (about the previous one)
	Leaves                  []tlog.Hash      `json:"-"`
}

// Detail is what a scan found beyond its EpochResult: what the writer's
// recovery, and the callers that set an epoch without records apart,
// need.
type Detail struct {
	Empty bool // no complete record at all
	// tail (writer recovery only): where a bad tail after the last checkpoint starts.
	TailErr   *record.VerifyError
	TailStart int64
	// endsSealed: the records before any damaged or torn tail end with
	// seal + checkpoint (what the epoch is once recovery cuts that tail).
	EndsSealed bool
	LastFile   string // the file of the last good line (or of the torn one)
}

// Epoch verifies one epoch directory.
func Epoch(dir string, epoch int, opt Options) (*EpochResult, error) {
	sc, err := openEpochScan(dir, epoch, opt)
	if err != nil {
		return sc.res, err
	}
	stop := make(chan struct{})
	defer close(stop)
	for b := range streamLines(sc.edir, sc.segs, stop, &sc.opt) {
		<-b.ready
		if b.ioErr != nil {
			return sc.res, record.IOFailure(record.Position{Epoch: epoch, File: b.file, Index: sc.res.Records}, b.ioErr)
		}
		if b.seg != sc.curSeg {
			sc.curSeg = b.seg
			sc.segStart = true
		}
		for i := range b.lines {
			if done, err := sc.line(b, &b.lines[i]); done {
				return sc.res, err
			}
		}
		if sc.opt.Progress != nil && sc.sinceProg > 0 {
			sc.opt.Progress(sc.sinceProg)
			sc.sinceProg = 0
		}
		if b.fileDone {
			sc.prevSum = b.fileSum
			sc.prevFile = filepath.Base(b.file)
		}
	}
	sc.finish()
	if sc.res.Records == 0 && sc.det.TailErr == nil {
		sc.det.Empty = true
		return sc.res, &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Epoch: epoch, File: filepath.Join(sc.edir, logdir.SegmentName(1))}, Msg: "epoch holds no complete record"}
	}
	return sc.res, nil
}

// epochScan is one Epoch: the epoch's segments, what the records
// before the current one established, and the result so far.
type epochScan struct {
	opt       Options
	epoch     int
	edir      string
	segs      []int
	lastCPOff int64 // tolerateTail: offset of the last checkpoint line of the last segment
	res       *EpochResult
	det       *Detail

	fr        merkle.Frontier
	lastKinds [2]record.Kind
	sealAt    int64 // index of the seal record, if any (-1)
	prev      tlog.Hash
	verifiers note.Verifiers
	g         *record.Genesis
	segStart  bool
	prevSum   []byte
	prevFile  string
	curSeg    int
	sinceProg int64
	ent       Entry // passed to opt.onRecord, reused

	firstTS, lastTS, signedLastTS []byte
}

// openEpochScan checks that the epoch directory holds segments numbered
// from 1 without gaps. Its result (sc.res) is valid on error too.
func openEpochScan(dir string, epoch int, opt Options) (*epochScan, error) {
	edir := filepath.Join(dir, logdir.EpochName(epoch))
	sc := &epochScan{opt: opt, epoch: epoch, edir: edir, lastCPOff: -1, sealAt: -1,
		res: &EpochResult{Epoch: epoch, Dir: edir, LastCheckpointAt: -1}, det: opt.Detail}
	if sc.det == nil {
		sc.det = new(Detail)
	}
	fi, err := os.Stat(edir)
	if err != nil {
		return sc, record.IOFailure(record.Position{Epoch: epoch}, err)
	}
	if !fi.IsDir() {
		return sc, record.IOFailure(record.Position{Epoch: epoch}, fmt.Errorf("%s is not a directory", edir))
	}
	segs, err := logdir.ListSegments(edir)
	if err != nil {
		return sc, record.IOFailure(record.Position{Epoch: epoch}, err)
	}
	if len(segs) == 0 {
		sc.det.Empty = true
		return sc, &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Epoch: epoch}, Msg: fmt.Sprintf("epoch directory %s holds no segment files (seg-000001.jsonl ...)", edir)}
	}
	for i, n := range segs {
		if n != i+1 {
			return sc, &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Epoch: epoch, File: filepath.Join(edir, logdir.SegmentName(i+1))},
				Msg: fmt.Sprintf("segment %s is missing (found %s)", logdir.SegmentName(i+1), logdir.SegmentName(n)), Hint: "a whole segment file was deleted or renamed"}
		}
	}
	sc.segs = segs
	sc.res.Segments = len(segs)
	if opt.TolerateTail {
		sc.lastCPOff = lastCheckpointLine(filepath.Join(edir, logdir.SegmentName(segs[len(segs)-1])))
	}
	return sc, nil
}

// finish fills in what the result says about the records as a whole.
func (sc *epochScan) finish() {
	res := sc.res
	res.First, _ = time.Parse(time.RFC3339Nano, string(sc.firstTS))
	res.Last, _ = time.Parse(time.RFC3339Nano, string(sc.lastTS))
	res.Root = sc.fr.Root()
	if res.LastCheckpointAt >= 0 {
		res.Unsealed = res.Records - res.LastCheckpointAt - 1
		res.SignedFirst = res.First
		res.SignedLast, _ = time.Parse(time.RFC3339Nano, string(sc.signedLastTS))
	} else {
		res.Unsealed = res.Records
	}
	res.Signed = res.Records - res.Unsealed
	sc.det.EndsSealed = sc.lastKinds == [2]record.Kind{record.KindSeal, record.KindCheckpoint}
	res.Sealed = sc.det.TailErr == nil && res.TornBytes == 0 && sc.det.EndsSealed
}

// scanned is the line being checked.
type scanned struct {
	b   *lineBatch
	l   *rawLine
	pos record.Position
}

// fail ends the scan at line ln with a VerifyError, or, in the last
// segment after its last checkpoint with tolerateTail, ends it there as a
// tail the writer's recovery cuts (done, no error).
func (sc *epochScan) fail(ln *scanned, class record.Class, expected, computed, format string, args ...any) (done bool, err error) {
	res := sc.res
	ln.pos.Record = Excerpt(ln.l.line)
	ve := &record.VerifyError{Class: class, Pos: ln.pos, Expected: expected, Computed: computed, Msg: fmt.Sprintf(format, args...)}
	if res.LastCheckpoint != nil {
		ve.LastGood = res.LastCheckpoint.Size
	}
	if sc.opt.TolerateTail && ln.b.seg == sc.segs[len(sc.segs)-1] && ln.l.off > sc.lastCPOff {
		sc.det.TailErr = ve
		sc.det.TailStart = ln.l.off
		sc.det.LastFile = ln.b.file
		sc.finish()
		return true, nil
	}
	return true, ve
}

// line checks one line and adds its record; done means the scan ends
// (with err, or with none for a tail recovery cuts).
func (sc *epochScan) line(b *lineBatch, l *rawLine) (done bool, err error) {
	res := sc.res
	ln := &scanned{b: b, l: l, pos: record.Position{Epoch: sc.epoch, File: b.file, Line: l.no, Offset: l.off, Index: res.Records, Kind: l.env.Kind}}
	if l.torn {
		if b.seg != sc.segs[len(sc.segs)-1] {
			return sc.fail(ln, record.ClassIntegrity, "", "", "segment %s ends with an incomplete line of %d bytes but is not the last segment", filepath.Base(b.file), len(l.line))
		}
		res.TornBytes = int64(len(l.line))
		p := ln.pos
		res.TornAt = &p
		sc.det.LastFile = b.file
		return false, nil
	}
	if l.tooLong {
		return sc.fail(ln, record.ClassIntegrity, "", "", "line is longer than %d bytes; no record is that large", record.MaxLineBytes)
	}
	if l.perr != nil {
		var se *jcs.SyntaxError
		if errors.As(l.perr, &se) {
			ln.pos.Offset += int64(se.Offset)
			return sc.fail(ln, record.ClassIntegrity, "", "", "malformed record: %s (byte %d of the line)", se.Msg, se.Offset)
		}
		return sc.fail(ln, record.ClassIntegrity, "", "", "malformed record: %v", l.perr)
	}
	if done, err := sc.place(ln); done {
		return done, err
	}
	e := &l.env
	tsBefore := sc.lastTS // the time of the last record before this one
	if e.TS != nil {
		if sc.firstTS == nil {
			sc.firstTS = e.TS
		}
		sc.lastTS = e.TS
	}
	switch e.Kind {
	case record.KindGenesis:
		done, err = sc.genesis(ln)
	case record.KindCheckpoint:
		done, err = sc.checkpoint(ln, tsBefore)
	case record.KindSegment:
		done, err = sc.segment(ln)
	case record.KindSeal:
		r, derr := record.DecodeBody(record.KindSeal, e.Body)
		if derr != nil {
			return sc.fail(ln, record.ClassIntegrity, "", "", "%v", derr)
		}
		if r.(*record.Seal).Records != res.Records {
			return sc.fail(ln, record.ClassIntegrity, fmt.Sprint(res.Records), fmt.Sprint(r.(*record.Seal).Records), "seal record counts another number of records")
		}
		sc.sealAt = res.Records
	case record.KindRecovery:
		r, derr := record.DecodeBody(record.KindRecovery, e.Body)
		if derr != nil {
			return sc.fail(ln, record.ClassIntegrity, "", "", "%v", derr)
		}
		res.Recovery = r.(*record.Recovery)
	}
	if done {
		return done, err
	}
	return sc.add(ln)
}

// place checks the record's place in the epoch: its sequence number and
// hash link, and which kinds may stand where.
func (sc *epochScan) place(ln *scanned) (done bool, err error) {
	res, b, e := sc.res, ln.b, &ln.l.env
	if e.Seq != res.Records {
		return sc.fail(ln, record.ClassIntegrity, fmt.Sprint(res.Records), fmt.Sprint(e.Seq), "sequence number %d, expected %d: a record was removed, duplicated or reordered", e.Seq, res.Records)
	}
	if e.Prev != sc.prev {
		return sc.fail(ln, record.ClassIntegrity, B64(e.Prev), B64(sc.prev), "broken hash link: prev does not match the hash of record %d: record %d was modified, or records between were removed", res.Records-1, res.Records-1)
	}
	if res.Records == 0 && e.Kind != record.KindGenesis {
		return sc.fail(ln, record.ClassIntegrity, string(record.KindGenesis), string(e.Kind), "the first record of an epoch must be genesis")
	}
	if sc.segStart && b.seg > 1 && e.Kind != record.KindSegment {
		return sc.fail(ln, record.ClassIntegrity, string(record.KindSegment), string(e.Kind), "the first record of segment %d must be a segment record", b.seg)
	}
	if !sc.segStart && e.Kind == record.KindSegment || b.seg == 1 && e.Kind == record.KindSegment {
		return sc.fail(ln, record.ClassIntegrity, "", "", "a segment record in the middle of a segment")
	}
	sc.segStart = false
	if res.Records > 0 && e.Kind == record.KindGenesis {
		return sc.fail(ln, record.ClassIntegrity, "", "", "a second genesis record inside an epoch")
	}
	// The writer's close is seal then the final checkpoint, and
	// nothing after: any record after them was not written by the
	// writer (a checkpoint there was signed by a key holder
	// extending a closed epoch; other records need no key at all).
	if sc.sealAt >= 0 && (e.Kind != record.KindCheckpoint || res.Records > sc.sealAt+1) {
		if e.Kind == record.KindCheckpoint {
			return sc.fail(ln, record.ClassIntegrity, "", "", "a checkpoint after the epoch's seal (record %d) and its final checkpoint: the writer signs nothing after closing the epoch", sc.sealAt)
		}
		return sc.fail(ln, record.ClassIntegrity, "", "", "a %s record after the epoch's seal (record %d) and its final checkpoint: the writer writes nothing after closing an epoch, so someone with write access appended it", e.Kind, sc.sealAt)
	}
	if e.Kind == record.KindRecovery && res.Records != 1 {
		return sc.fail(ln, record.ClassIntegrity, "", "", "a recovery record at index %d: the writer writes it right after the genesis record (index 1) only", res.Records)
	}
	return false, nil
}

// genesis checks the genesis record: its epoch, key, origin and
// statement, and (per the options) that its key is trusted and its
// evidence holds.
func (sc *epochScan) genesis(ln *scanned) (done bool, err error) {
	res, epoch, e := sc.res, sc.epoch, &ln.l.env
	r, err := record.DecodeBody(record.KindGenesis, e.Body)
	if err != nil {
		return sc.fail(ln, record.ClassIntegrity, "", "", "genesis: %v", err)
	}
	g := r.(*record.Genesis)
	sc.g = g
	res.Genesis = g
	if g.Epoch != epoch {
		return sc.fail(ln, record.ClassIntegrity, fmt.Sprint(epoch), fmt.Sprint(g.Epoch), "genesis names epoch %d but sits in %s", g.Epoch, logdir.EpochName(epoch))
	}
	v, err := note.NewVerifier(g.Key)
	if err != nil {
		return sc.fail(ln, record.ClassIntegrity, "", "", "genesis key %q: %v", g.Key, err)
	}
	if v.Name() != g.Origin {
		return sc.fail(ln, record.ClassIntegrity, g.Origin, v.Name(), "genesis key name differs from the origin")
	}
	if n := logdir.EpochOfOrigin(g.Origin); n != epoch {
		// Origins name their epoch: an epoch cannot borrow
		// another's origin, key or saved checkpoints.
		return sc.fail(ln, record.ClassIntegrity, fmt.Sprintf("<name>/%s-<8 hex digits>", logdir.EpochName(epoch)), g.Origin, "genesis origin %q does not name %s", g.Origin, logdir.EpochName(epoch))
	}
	res.Origin, res.Key = g.Origin, g.Key
	sc.verifiers = note.VerifierList(v)
	st, err := StatementOf(e.Body)
	if err != nil {
		return sc.fail(ln, record.ClassIntegrity, "", "", "genesis statement: %v", err)
	}
	if !st.Equal(g.Statement) {
		return sc.fail(ln, record.ClassIntegrity, g.Statement.String(), st.String(), "genesis statement digest does not match its body")
	}
	if sc.opt.Trusted != nil {
		if !sc.opt.Trusted[g.Key] {
			ve := &record.VerifyError{Class: record.ClassKey, Pos: ln.pos, Computed: g.Key,
				Msg:  fmt.Sprintf("epoch %d is signed by key %s+%08x, which is not among the trusted keys (--key)", epoch, v.Name(), v.KeyHash()),
				Hint: "the log was written (or rewritten) with another key; pass the gateway's key with --key if it is genuine"}
			return true, ve
		}
	}
	if sc.opt.Evidence != nil {
		if err := sc.opt.Evidence(g); err != nil {
			return true, &record.VerifyError{Class: record.ClassKey, Pos: ln.pos, Msg: fmt.Sprintf("genesis evidence: %v", err), Err: err}
		}
	}
	return false, nil
}

// checkpoint checks a checkpoint record: its signature by the epoch's key,
// its origin, its size and its root. tsBefore is the time of the record
// before it, the last its tree signs.
func (sc *epochScan) checkpoint(ln *scanned, tsBefore []byte) (done bool, err error) {
	res, g, e := sc.res, sc.g, &ln.l.env
	r, err := record.DecodeBody(record.KindCheckpoint, e.Body)
	if err != nil {
		return sc.fail(ln, record.ClassIntegrity, "", "", "%v", err)
	}
	msg := []byte(r.(*record.CheckpointRecord).Note)
	cp, err := c2sp.OpenCheckpoint(msg, sc.verifiers)
	if err != nil {
		var uv *note.UnverifiedNoteError
		var bad *note.InvalidSignatureError
		switch {
		case errors.As(err, &bad):
			return sc.fail(ln, record.ClassSignature, "", "", "checkpoint signature does not verify: %v", err)
		case errors.As(err, &uv):
			return sc.fail(ln, record.ClassKey, g.Key, SigNames(uv.Note), "checkpoint is not signed by the epoch's key (signed by %s)", SigNames(uv.Note))
		case errors.Is(err, c2sp.ErrMalformedCheckpoint):
			return sc.fail(ln, record.ClassIntegrity, "", "", "%v", err)
		default:
			return sc.fail(ln, record.ClassSignature, "", "", "checkpoint rejected: %v", err)
		}
	}
	if cp.Origin != g.Origin {
		return sc.fail(ln, record.ClassIntegrity, g.Origin, cp.Origin, "checkpoint origin differs from the epoch's origin")
	}
	if cp.Size != res.Records {
		return sc.fail(ln, record.ClassIntegrity, fmt.Sprint(res.Records), fmt.Sprint(cp.Size), "checkpoint size does not match its position (it must cover exactly the records before it)")
	}
	if root := sc.fr.Root(); root != cp.Root {
		return sc.fail(ln, record.ClassIntegrity, B64(cp.Root), B64(root), "Merkle root mismatch at size %d: the checkpoint signs one root, the records hash to another", cp.Size)
	}
	res.LastCheckpoint = cp
	res.LastCheckpointAt = res.Records
	if sc.opt.OnCheckpoint != nil {
		sc.opt.OnCheckpoint(cp)
	}
	res.Checkpoints++
	// Its own time is not signed: only the records before it are.
	sc.signedLastTS = tsBefore
	return false, nil
}

// segment checks a segment record against the segment it opens and the
// file and checkpoint that closed the previous one.
func (sc *epochScan) segment(ln *scanned) (done bool, err error) {
	res, b, e := sc.res, ln.b, &ln.l.env
	r, err := record.DecodeBody(record.KindSegment, e.Body)
	if err != nil {
		return sc.fail(ln, record.ClassIntegrity, "", "", "%v", err)
	}
	s := r.(*record.Segment)
	switch {
	case s.Number != b.seg:
		return sc.fail(ln, record.ClassIntegrity, fmt.Sprint(b.seg), fmt.Sprint(s.Number), "segment record names another segment number")
	case s.FirstIndex != res.Records:
		return sc.fail(ln, record.ClassIntegrity, fmt.Sprint(res.Records), fmt.Sprint(s.FirstIndex), "segment record names another first index")
	case s.PrevFile != sc.prevFile:
		return sc.fail(ln, record.ClassIntegrity, sc.prevFile, s.PrevFile, "segment record names another previous file")
	case !bytes.Equal(s.PrevSHA256, sc.prevSum):
		return sc.fail(ln, record.ClassIntegrity, fmt.Sprintf("%x", s.PrevSHA256), fmt.Sprintf("%x", sc.prevSum), "the previous segment file %s does not hash to what the segment record says: it was modified", sc.prevFile)
	case res.LastCheckpoint == nil || s.Checkpoint != string(res.LastCheckpoint.Note):
		return sc.fail(ln, record.ClassIntegrity, "", "", "segment record does not carry the checkpoint that closed the previous segment")
	}
	sf, err := merkle.FrontierFrom(res.Records, s.Frontier)
	if err != nil || sf.Root() != sc.fr.Root() {
		return sc.fail(ln, record.ClassIntegrity, "", "", "segment record's tree frontier does not match the records before it")
	}
	return false, nil
}

// add adds a record that checked out: to the caller (onRecord), to the
// tree, and to the result.
func (sc *epochScan) add(ln *scanned) (done bool, err error) {
	res, l, e := sc.res, ln.l, &ln.l.env
	opt := &sc.opt
	if opt.OnRecord != nil {
		p := ln.pos
		p.Index, p.Kind = res.Records, e.Kind
		sc.ent = Entry{Pos: p, Kind: e.Kind, Index: e.Seq, Time: l.ts, Hash: l.hash, Line: l.line, Body: e.Body,
			rec: l.rec, decErr: l.decErr, decoded: l.decoded}
		if err := opt.OnRecord(&sc.ent); err != nil {
			return true, err
		}
	}
	sc.fr.Append(l.hash)
	if opt.OnLeaf != nil {
		opt.OnLeaf(l.hash)
	}
	sc.prev = l.hash
	if opt.KeepLeaves {
		res.Leaves = append(res.Leaves, l.hash)
	}
	res.Records++
	if want := opt.WantRoots[res.Origin]; want != nil {
		if p, ok := want[res.Records]; ok && p == nil {
			r := sc.fr.Root()
			want[res.Records] = &r
		}
	}
	sc.lastKinds[0], sc.lastKinds[1] = sc.lastKinds[1], e.Kind
	sc.det.LastFile = ln.b.file
	sc.sinceProg += int64(len(l.line)) + 1
	return false, nil
}

// B64 is h in standard base64, as errors and reports show hashes.
func B64(h tlog.Hash) string { return base64.StdEncoding.EncodeToString(h[:]) }

// Excerpt is the start of a line as an error shows it: valid UTF-8,
// at most 160 bytes.
func Excerpt(b []byte) string {
	if len(b) > 160 {
		return string(bytes.ToValidUTF8(b[:157], []byte("?"))) + "..."
	}
	return string(bytes.ToValidUTF8(b, []byte("?")))
}

// Verifiers verifies a note's signatures by the trusted keys (vkeys, as
// auditlog.ParseKeys returns them: each already parsed once).
func Verifiers(trusted map[string]bool) note.Verifiers {
	var list []note.Verifier
	for k := range trusted {
		v, _ := note.NewVerifier(k)
		list = append(list, v)
	}
	return note.VerifierList(list...)
}

// SigNames names the keys (name+hash) that signed n but did not verify,
// or "no key".
func SigNames(n *note.Note) string {
	var b bytes.Buffer
	for i, s := range n.UnverifiedSigs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s+%08x", s.Name, s.Hash)
	}
	if b.Len() == 0 {
		return "no key"
	}
	return b.String()
}

// StatementOf returns the statement digest of a genesis body: the digest of
// its canonical JSON with the "statement" and "evidence" members removed.
func StatementOf(body []byte) (digest.Digest, error) {
	var m map[string]jsontext.Value
	if err := jsonv2.Unmarshal(body, &m); err != nil {
		return digest.Digest{}, fmt.Errorf("genesis statement: %w", err)
	}
	delete(m, "statement")
	delete(m, "evidence")
	raw, err := jsonv2.Marshal(m, jsonv2.Deterministic(true))
	if err != nil {
		return digest.Digest{}, fmt.Errorf("genesis statement: %w", err)
	}
	return digest.JSON(raw)
}

// lastCheckpointLine returns the offset of the start of the last complete
// line of a segment that is a checkpoint record, or -1. Crash recovery cuts
// only damage after it. The file is read backwards in chunks: a crash can
// leave a tail of any length (a run of zero bytes), and memory stays
// bounded by the chunk and one line (a line longer than MaxLineBytes is no
// record, and is skipped unread).
func lastCheckpointLine(path string) int64 {
	f, err := logdir.OpenRegular(path)
	if err != nil {
		return -1 // the scan reports what the file is
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return -1
	}
	return lastCheckpointIn(f, fi.Size(), scanChunk)
}

// scanChunk is the size of the chunks lastCheckpointLine reads.
const scanChunk = 256 << 10

// lastCheckpointIn is lastCheckpointLine on the first size bytes of r,
// read in chunks of chunkSize bytes. The chunk last read is kept and the
// lines are found inside it, so each byte of the tail is read once (and a
// line that crosses a chunk boundary once more, to parse it): a tail of
// many short lines costs its length, not a chunk per line.
func lastCheckpointIn(r io.ReaderAt, size int64, chunkSize int) int64 {
	s := backScan{r: r, buf: make([]byte, chunkSize)}
	var line []byte
	end, err := s.newlineBefore(size)
	for err == nil && end > 0 {
		var nl int64
		if nl, err = s.newlineBefore(end); err != nil {
			break
		}
		start := nl + 1
		if n := end - start; n <= record.MaxLineBytes {
			var l []byte
			if b, ok := s.cached(start, end); ok {
				l = b
			} else {
				line = slices.Grow(line[:0], int(n))[:n]
				if _, err = r.ReadAt(line, start); err != nil {
					break
				}
				l = line
			}
			// Parsed, not searched: a record's body may hold the same bytes.
			if e, perr := record.ParseLine(l); perr == nil && e.Kind == record.KindCheckpoint {
				return start
			}
		}
		end = start - 1
	}
	return -1
}

// backScan finds line breaks backwards through r, one chunk in memory.
type backScan struct {
	r    io.ReaderAt
	buf  []byte
	base int64 // buf[:n] holds r's bytes from base
	n    int
}

// newlineBefore returns the offset of the last '\n' before pos, or -1:
// from the chunk in memory while it holds the bytes before pos, reading
// the chunk before it when they are used up.
func (s *backScan) newlineBefore(pos int64) (int64, error) {
	for pos > 0 {
		if pos > s.base && pos <= s.base+int64(s.n) {
			if i := bytes.LastIndexByte(s.buf[:pos-s.base], '\n'); i >= 0 {
				return s.base + int64(i), nil
			}
			pos = s.base
			continue
		}
		n := min(int64(len(s.buf)), pos)
		if _, err := s.r.ReadAt(s.buf[:n], pos-n); err != nil {
			s.n = 0
			return -1, err
		}
		s.base, s.n = pos-n, int(n)
	}
	return -1, nil
}

// cached returns r's bytes from start to end when the chunk in memory
// holds them all.
func (s *backScan) cached(start, end int64) ([]byte, bool) {
	if start < s.base || end > s.base+int64(s.n) {
		return nil, false
	}
	return s.buf[start-s.base : end-s.base], true
}
