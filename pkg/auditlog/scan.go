package auditlog

import (
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/jcs"

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

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Position locates a record or a failure in an audit directory.
type Position struct {
	Epoch  int    `json:"epoch"`
	File   string `json:"file,omitempty"`   // path of the segment file
	Line   int64  `json:"line,omitempty"`   // 1-based line in the file
	Offset int64  `json:"offset"`           // byte offset in the file
	Index  int64  `json:"index"`            // record index (seq) in the epoch
	Kind   Kind   `json:"kind,omitempty"`   // kind of the record, if known
	Record string `json:"record,omitempty"` // excerpt of the line
}

func (p Position) String() string {
	if p.File == "" {
		return fmt.Sprintf("epoch %d", p.Epoch)
	}
	if p.Line == 0 {
		return fmt.Sprintf("epoch %d, %s", p.Epoch, p.File)
	}
	return fmt.Sprintf("epoch %d, record %d (%s:%d, byte %d)", p.Epoch, p.Index, p.File, p.Line, p.Offset)
}

// rawLine is one line of a segment with what the workers computed for it.
type rawLine struct {
	line    []byte // without '\n'
	off     int64
	no      int64
	torn    bool // final fragment without '\n'
	tooLong bool
	env     envelope
	hash    tlog.Hash
	perr    error
	// With scanOptions.onRecord only:
	ts      time.Time
	rec     Record // decoded body, if scanOptions.decode selected its kind
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
func streamLines(epochDir string, segs []int, stop <-chan struct{}, opt *scanOptions) <-chan *lineBatch {
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
					l.env, l.perr = parseLine(l.line)
					l.hash = tlog.RecordHash(l.line)
					if opt.onRecord != nil && l.perr == nil {
						if l.env.TS != nil {
							l.ts, _ = time.Parse(time.RFC3339Nano, string(l.env.TS))
						}
						if opt.decode != nil && opt.decode(l.env.Kind) {
							l.rec, l.decErr = DecodeBody(l.env.Kind, l.env.Body)
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
			path := filepath.Join(epochDir, segmentName(n))
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
	if fi, err := f.Stat(); err != nil {
		return fail(err)
	} else if !fi.Mode().IsRegular() {
		what := "a directory"
		if !fi.IsDir() {
			what = "a " + fi.Mode().Type().String() + " file"
		}
		return fail(fmt.Errorf("the segment is not a regular file: it is %s", what))
	}
	sum := sha256.New()
	var carry []byte
	var off, no int64
	for {
		buf := make([]byte, len(carry), len(carry)+chunkSize)
		copy(buf, carry)
		n, rerr := io.ReadFull(f, buf[len(carry):cap(buf)])
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
		rest := buf
		for {
			i := bytes.IndexByte(rest, '\n')
			if i < 0 {
				break
			}
			no++
			b.lines = append(b.lines, rawLine{line: rest[:i], off: off, no: no})
			if i > MaxLineBytes {
				b.lines[len(b.lines)-1].tooLong = true
				b.lines[len(b.lines)-1].line = rest[:256]
			}
			off += int64(i + 1)
			rest = rest[i+1:]
		}
		carry = rest
		if len(carry) > MaxLineBytes {
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

// scanOptions control scanEpoch.
type scanOptions struct {
	trusted    map[string]bool                 // nil: trust the genesis key (reported by the caller)
	wantRoots  map[string]map[int64]*tlog.Hash // by origin: sizes whose roots to keep
	keepLeaves bool
	progress   func(bytes int64)
	evidence   func(g *Genesis) error
	// tolerateTail: in the last segment, report an error after the last
	// checkpoint as a cuttable tail instead of failing (writer recovery).
	tolerateTail bool
	onRecord     func(e *Entry) error // see VerifyOptions.OnRecord
	decode       func(k Kind) bool    // see VerifyOptions.Decode
	onLeaf       func(h tlog.Hash)    // every record's leaf hash, in order
	onCheckpoint func(cp *Checkpoint) // every checkpoint that verified, in order
}

// EpochResult is what verifying one epoch established.
type EpochResult struct {
	Epoch            int         `json:"epoch"`
	Dir              string      `json:"dir"`
	Origin           string      `json:"origin"`
	Key              string      `json:"key"`
	Genesis          *Genesis    `json:"-"`
	Segments         int         `json:"segments"`
	Records          int64       `json:"records"`
	Checkpoints      int         `json:"checkpoints"`
	LastCheckpoint   *Checkpoint `json:"-"`
	LastCheckpointAt int64       `json:"last_checkpoint_index"` // index of the last checkpoint record, -1 if none
	Unsealed         int64       `json:"unsealed"`              // records after the last checkpoint
	// Signed is the number of records up to and including the last
	// checkpoint (Records - Unsealed): the ones it signs, and itself.
	// SignedFirst and SignedLast are the times of the first and the last
	// record its tree covers (zero without a checkpoint).
	Signed                  int64       `json:"signed"`
	SignedFirst, SignedLast time.Time   `json:"-"`
	Sealed                  bool        `json:"sealed"`     // ended with seal + final checkpoint
	TornBytes               int64       `json:"torn_bytes"` // incomplete final line (crash)
	TornAt                  *Position   `json:"torn_at,omitempty"`
	First, Last             time.Time   `json:"-"`
	Root                    tlog.Hash   `json:"-"`
	Recovery                *Recovery   `json:"-"` // recovery record in this epoch (about the previous one)
	Leaves                  []tlog.Hash `json:"-"`

	// tail (writer recovery only): where a bad tail after the last checkpoint starts.
	tailErr   *VerifyError
	tailStart int64
	// endsSealed: the records before any damaged or torn tail end with
	// seal + checkpoint (what the epoch is once recovery cuts that tail).
	endsSealed bool
	lastFile   string
	lastEnd    int64 // end offset of the last good line in the last file
	empty      bool  // no complete record at all
}

// scanEpoch verifies one epoch directory.
func scanEpoch(dir string, epoch int, opt scanOptions) (*EpochResult, error) {
	edir := filepath.Join(dir, epochName(epoch))
	res := &EpochResult{Epoch: epoch, Dir: edir, LastCheckpointAt: -1}
	fi, err := os.Stat(edir)
	if err != nil {
		return res, ioFailure(Position{Epoch: epoch}, err)
	}
	if !fi.IsDir() {
		return res, ioFailure(Position{Epoch: epoch}, fmt.Errorf("%s is not a directory", edir))
	}
	segs, err := listSegments(edir)
	if err != nil {
		return res, ioFailure(Position{Epoch: epoch}, err)
	}
	if len(segs) == 0 {
		res.empty = true
		return res, &VerifyError{Class: ClassIntegrity, Pos: Position{Epoch: epoch}, Msg: fmt.Sprintf("epoch directory %s holds no segment files (seg-000001.jsonl ...)", edir)}
	}
	for i, n := range segs {
		if n != i+1 {
			return res, &VerifyError{Class: ClassIntegrity, Pos: Position{Epoch: epoch, File: filepath.Join(edir, segmentName(i+1))},
				Msg: fmt.Sprintf("segment %s is missing (found %s)", segmentName(i+1), segmentName(n)), Hint: "a whole segment file was deleted or renamed"}
		}
	}
	res.Segments = len(segs)
	lastCPOff := int64(-1)
	if opt.tolerateTail {
		lastCPOff = lastCheckpointLine(filepath.Join(edir, segmentName(segs[len(segs)-1])))
	}
	stop := make(chan struct{})
	defer close(stop)
	ch := streamLines(edir, segs, stop, &opt)

	var (
		fr        frontier
		lastKinds [2]Kind
		sealAt    int64 = -1 // index of the seal record, if any
		prev      tlog.Hash
		verifiers note.Verifiers
		g         *Genesis
		segStart  bool
		prevSum   []byte
		prevFile  string
		curSeg    int
		sinceProg int64
		ent       Entry // passed to opt.onRecord, reused
	)
	var firstTS, lastTS, signedLastTS []byte
	finish := func() {
		res.First, _ = time.Parse(time.RFC3339Nano, string(firstTS))
		res.Last, _ = time.Parse(time.RFC3339Nano, string(lastTS))
		res.Root = fr.root()
		if res.LastCheckpointAt >= 0 {
			res.Unsealed = res.Records - res.LastCheckpointAt - 1
			res.SignedFirst = res.First
			res.SignedLast, _ = time.Parse(time.RFC3339Nano, string(signedLastTS))
		} else {
			res.Unsealed = res.Records
		}
		res.Signed = res.Records - res.Unsealed
		res.endsSealed = lastKinds == [2]Kind{KindSeal, KindCheckpoint}
		res.Sealed = res.tailErr == nil && res.TornBytes == 0 && res.endsSealed
	}
	for b := range ch {
		<-b.ready
		if b.ioErr != nil {
			return res, ioFailure(Position{Epoch: epoch, File: b.file, Index: res.Records}, b.ioErr)
		}
		if b.seg != curSeg {
			curSeg = b.seg
			segStart = true
		}
		for i := range b.lines {
			l := &b.lines[i]
			pos := Position{Epoch: epoch, File: b.file, Line: l.no, Offset: l.off, Index: res.Records, Kind: l.env.Kind}
			fail := func(class Class, expected, computed, format string, args ...any) (*EpochResult, error) {
				pos.Record = excerpt(l.line)
				ve := &VerifyError{Class: class, Pos: pos, Expected: expected, Computed: computed, Msg: fmt.Sprintf(format, args...)}
				if res.LastCheckpoint != nil {
					ve.LastGood = res.LastCheckpoint.Size
				}
				if opt.tolerateTail && b.seg == segs[len(segs)-1] && l.off > lastCPOff {
					res.tailErr = ve
					res.tailStart = l.off
					res.lastFile = b.file
					finish()
					return res, nil
				}
				return res, ve
			}
			isLastSeg := b.seg == segs[len(segs)-1]
			if l.torn {
				if !isLastSeg {
					return fail(ClassIntegrity, "", "", "segment %s ends with an incomplete line of %d bytes but is not the last segment", filepath.Base(b.file), len(l.line))
				}
				res.TornBytes = int64(len(l.line))
				p := pos
				res.TornAt = &p
				res.lastFile = b.file
				continue
			}
			if l.tooLong {
				return fail(ClassIntegrity, "", "", "line is longer than %d bytes; no record is that large", MaxLineBytes)
			}
			if l.perr != nil {
				var se *jcs.SyntaxError
				if errors.As(l.perr, &se) {
					pos.Offset += int64(se.Offset)
					return fail(ClassIntegrity, "", "", "malformed record: %s (byte %d of the line)", se.Msg, se.Offset)
				}
				return fail(ClassIntegrity, "", "", "malformed record: %v", l.perr)
			}
			e := &l.env
			if e.Seq != res.Records {
				return fail(ClassIntegrity, fmt.Sprint(res.Records), fmt.Sprint(e.Seq), "sequence number %d, expected %d: a record was removed, duplicated or reordered", e.Seq, res.Records)
			}
			if e.Prev != prev {
				return fail(ClassIntegrity, b64(e.Prev), b64(prev), "broken hash link: prev does not match the hash of record %d: record %d was modified, or records between were removed", res.Records-1, res.Records-1)
			}
			if res.Records == 0 && e.Kind != KindGenesis {
				return fail(ClassIntegrity, string(KindGenesis), string(e.Kind), "the first record of an epoch must be genesis")
			}
			if segStart && b.seg > 1 && e.Kind != KindSegment {
				return fail(ClassIntegrity, string(KindSegment), string(e.Kind), "the first record of segment %d must be a segment record", b.seg)
			}
			if !segStart && e.Kind == KindSegment || b.seg == 1 && e.Kind == KindSegment {
				return fail(ClassIntegrity, "", "", "a segment record in the middle of a segment")
			}
			segStart = false
			if res.Records > 0 && e.Kind == KindGenesis {
				return fail(ClassIntegrity, "", "", "a second genesis record inside an epoch")
			}
			// The writer's close is seal then the final checkpoint, and
			// nothing after: any record after them was not written by the
			// writer (a checkpoint there was signed by a key holder
			// extending a closed epoch; other records need no key at all).
			if sealAt >= 0 && (e.Kind != KindCheckpoint || res.Records > sealAt+1) {
				if e.Kind == KindCheckpoint {
					return fail(ClassIntegrity, "", "", "a checkpoint after the epoch's seal (record %d) and its final checkpoint: the writer signs nothing after closing the epoch", sealAt)
				}
				return fail(ClassIntegrity, "", "", "a %s record after the epoch's seal (record %d) and its final checkpoint: the writer writes nothing after closing an epoch, so someone with write access appended it", e.Kind, sealAt)
			}
			if e.Kind == KindRecovery && res.Records != 1 {
				return fail(ClassIntegrity, "", "", "a recovery record at index %d: the writer writes it right after the genesis record (index 1) only", res.Records)
			}
			tsBefore := lastTS // the time of the last record before this one
			if e.TS != nil {
				if firstTS == nil {
					firstTS = e.TS
				}
				lastTS = e.TS
			}
			switch e.Kind {
			case KindGenesis:
				r, err := DecodeBody(KindGenesis, e.Body)
				if err != nil {
					return fail(ClassIntegrity, "", "", "genesis: %v", err)
				}
				g = r.(*Genesis)
				res.Genesis = g
				if g.Epoch != epoch {
					return fail(ClassIntegrity, fmt.Sprint(epoch), fmt.Sprint(g.Epoch), "genesis names epoch %d but sits in %s", g.Epoch, epochName(epoch))
				}
				v, err := note.NewVerifier(g.Key)
				if err != nil {
					return fail(ClassIntegrity, "", "", "genesis key %q: %v", g.Key, err)
				}
				if v.Name() != g.Origin {
					return fail(ClassIntegrity, g.Origin, v.Name(), "genesis key name differs from the origin")
				}
				if n := epochOfOrigin(g.Origin); n != epoch {
					// Origins name their epoch: an epoch cannot borrow
					// another's origin, key or saved checkpoints.
					return fail(ClassIntegrity, fmt.Sprintf("<name>/%s-<8 hex digits>", epochName(epoch)), g.Origin, "genesis origin %q does not name %s", g.Origin, epochName(epoch))
				}
				res.Origin, res.Key = g.Origin, g.Key
				verifiers = note.VerifierList(v)
				st, err := StatementOf(e.Body)
				if err != nil {
					return fail(ClassIntegrity, "", "", "genesis statement: %v", err)
				}
				if !st.Equal(g.Statement) {
					return fail(ClassIntegrity, g.Statement.String(), st.String(), "genesis statement digest does not match its body")
				}
				if opt.trusted != nil {
					if !opt.trusted[g.Key] {
						ve := &VerifyError{Class: ClassKey, Pos: pos, Computed: g.Key,
							Msg:  fmt.Sprintf("epoch %d is signed by key %s+%08x, which is not among the trusted keys (--key)", epoch, v.Name(), v.KeyHash()),
							Hint: "the log was written (or rewritten) with another key; pass the gateway's key with --key if it is genuine"}
						return res, ve
					}
				}
				if opt.evidence != nil {
					if err := opt.evidence(g); err != nil {
						return res, &VerifyError{Class: ClassKey, Pos: pos, Msg: fmt.Sprintf("genesis evidence: %v", err), Err: err}
					}
				}
			case KindCheckpoint:
				r, err := DecodeBody(KindCheckpoint, e.Body)
				if err != nil {
					return fail(ClassIntegrity, "", "", "%v", err)
				}
				msg := []byte(r.(*CheckpointRecord).Note)
				cp, err := OpenCheckpoint(msg, verifiers)
				if err != nil {
					var uv *note.UnverifiedNoteError
					var bad *note.InvalidSignatureError
					switch {
					case errors.As(err, &bad):
						return fail(ClassSignature, "", "", "checkpoint signature does not verify: %v", err)
					case errors.As(err, &uv):
						return fail(ClassKey, g.Key, sigNames(uv.Note), "checkpoint is not signed by the epoch's key (signed by %s)", sigNames(uv.Note))
					case errors.Is(err, ErrMalformedCheckpoint):
						return fail(ClassIntegrity, "", "", "%v", err)
					default:
						return fail(ClassSignature, "", "", "checkpoint rejected: %v", err)
					}
				}
				if cp.Origin != g.Origin {
					return fail(ClassIntegrity, g.Origin, cp.Origin, "checkpoint origin differs from the epoch's origin")
				}
				if cp.Size != res.Records {
					return fail(ClassIntegrity, fmt.Sprint(res.Records), fmt.Sprint(cp.Size), "checkpoint size does not match its position (it must cover exactly the records before it)")
				}
				if root := fr.root(); root != cp.Root {
					return fail(ClassIntegrity, b64(cp.Root), b64(root), "Merkle root mismatch at size %d: the checkpoint signs one root, the records hash to another", cp.Size)
				}
				res.LastCheckpoint = cp
				res.LastCheckpointAt = res.Records
				if opt.onCheckpoint != nil {
					opt.onCheckpoint(cp)
				}
				res.Checkpoints++
				// Its own time is not signed: only the records before it are.
				signedLastTS = tsBefore
			case KindSegment:
				r, err := DecodeBody(KindSegment, e.Body)
				if err != nil {
					return fail(ClassIntegrity, "", "", "%v", err)
				}
				s := r.(*Segment)
				switch {
				case s.Number != b.seg:
					return fail(ClassIntegrity, fmt.Sprint(b.seg), fmt.Sprint(s.Number), "segment record names another segment number")
				case s.FirstIndex != res.Records:
					return fail(ClassIntegrity, fmt.Sprint(res.Records), fmt.Sprint(s.FirstIndex), "segment record names another first index")
				case s.PrevFile != prevFile:
					return fail(ClassIntegrity, prevFile, s.PrevFile, "segment record names another previous file")
				case !bytes.Equal(s.PrevSHA256, prevSum):
					return fail(ClassIntegrity, fmt.Sprintf("%x", s.PrevSHA256), fmt.Sprintf("%x", prevSum), "the previous segment file %s does not hash to what the segment record says: it was modified", prevFile)
				case res.LastCheckpoint == nil || s.Checkpoint != string(res.LastCheckpoint.Note):
					return fail(ClassIntegrity, "", "", "segment record does not carry the checkpoint that closed the previous segment")
				}
				sf, err := frontierFrom(res.Records, s.Frontier)
				if err != nil || sf.root() != fr.root() {
					return fail(ClassIntegrity, "", "", "segment record's tree frontier does not match the records before it")
				}
			case KindSeal:
				r, err := DecodeBody(KindSeal, e.Body)
				if err != nil {
					return fail(ClassIntegrity, "", "", "%v", err)
				}
				if r.(*Seal).Records != res.Records {
					return fail(ClassIntegrity, fmt.Sprint(res.Records), fmt.Sprint(r.(*Seal).Records), "seal record counts another number of records")
				}
				sealAt = res.Records
			case KindRecovery:
				r, err := DecodeBody(KindRecovery, e.Body)
				if err != nil {
					return fail(ClassIntegrity, "", "", "%v", err)
				}
				res.Recovery = r.(*Recovery)
			}
			if opt.onRecord != nil {
				p := pos
				p.Index, p.Kind = res.Records, e.Kind
				ent = Entry{Pos: p, Kind: e.Kind, Index: e.Seq, Time: l.ts, Hash: l.hash, Line: l.line, Body: e.Body,
					rec: l.rec, decErr: l.decErr, decoded: l.decoded}
				if err := opt.onRecord(&ent); err != nil {
					return res, err
				}
			}
			fr.append(l.hash)
			if opt.onLeaf != nil {
				opt.onLeaf(l.hash)
			}
			prev = l.hash
			if opt.keepLeaves {
				res.Leaves = append(res.Leaves, l.hash)
			}
			res.Records++
			if want := opt.wantRoots[res.Origin]; want != nil {
				if p, ok := want[res.Records]; ok && p == nil {
					r := fr.root()
					want[res.Records] = &r
				}
			}
			lastKinds[0], lastKinds[1] = lastKinds[1], e.Kind
			res.lastFile = b.file
			res.lastEnd = l.off + int64(len(l.line)) + 1
			sinceProg += int64(len(l.line)) + 1
		}
		if opt.progress != nil && sinceProg > 0 {
			opt.progress(sinceProg)
			sinceProg = 0
		}
		if b.fileDone {
			prevSum = b.fileSum
			prevFile = filepath.Base(b.file)
		}
	}
	finish()
	if res.Records == 0 && res.tailErr == nil {
		res.empty = true
		return res, &VerifyError{Class: ClassIntegrity, Pos: Position{Epoch: epoch, File: filepath.Join(edir, segmentName(1))}, Msg: "epoch holds no complete record"}
	}
	return res, nil
}

func b64(h tlog.Hash) string { return base64.StdEncoding.EncodeToString(h[:]) }

func excerpt(b []byte) string {
	if len(b) > 160 {
		return string(bytes.ToValidUTF8(b[:157], []byte("?"))) + "..."
	}
	return string(bytes.ToValidUTF8(b, []byte("?")))
}

func sigNames(n *note.Note) string {
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

// lastCheckpointLine returns the offset of the start of the last complete
// line of a segment that is a checkpoint record, or -1. Crash recovery cuts
// only damage after it. The file is read backwards in chunks: a crash can
// leave a tail of any length (a run of zero bytes), and memory stays
// bounded by the chunk and one line (a line longer than MaxLineBytes is no
// record, and is skipped unread).
func lastCheckpointLine(path string) int64 {
	f, err := openRegular(path)
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
		if n := end - start; n <= MaxLineBytes {
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
			if e, perr := parseLine(l); perr == nil && e.Kind == KindCheckpoint {
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
