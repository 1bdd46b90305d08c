package excerpt

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/merkle"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// SegmentResult is what VerifySegment established about one segment file.
type SegmentResult struct {
	File           string           `json:"file"`
	Origin         string           `json:"origin"`
	Epoch          int              `json:"epoch"`
	FirstIndex     int64            `json:"first_index"`
	Records        int64            `json:"records"`     // records in this file
	Checkpoints    int              `json:"checkpoints"` // checkpoints in this file
	LastCheckpoint *c2sp.Checkpoint `json:"-"`
	// CoveredThrough is the index of the last record the file's last
	// checkpoint signs (its tree size minus one), nil when the file holds
	// no checkpoint: then none of its records is signed.
	CoveredThrough *int64 `json:"covered_through"`
	Unsealed       int64  `json:"unsealed"` // records after the last checkpoint in this file
	TornBytes      int64  `json:"torn_bytes"`
}

// VerifySegment verifies one segment file without the rest of its epoch.
// A first segment starts with the genesis record; a later one starts with
// a segment record that carries the checkpoint closing the previous segment
// and the tree frontier before it. That checkpoint must be signed by one of
// opt.Keys; the frontier and every record of the file are then
// authenticated by the checkpoints inside the file (each root is recomputed
// from the frontier and the records). Records after the file's last
// checkpoint are reported as unsealed. A file without a checkpoint of its
// own is not verified: it returns the result and a ClassUnsigned error, as
// the carried checkpoint signs none of the file's records.
func VerifySegment(path string, opt auditlog.VerifyOptions) (*SegmentResult, error) {
	res := &SegmentResult{File: path}
	trusted, err := auditlog.ParseKeys(opt.Keys)
	if err != nil {
		return res, err
	}
	if len(trusted) == 0 {
		return res, &record.VerifyError{Class: record.ClassUsage, Msg: "verifying a segment on its own needs the trusted key (--key): the genesis record is in another file"}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0) // a FIFO must not block: refused below
	if err != nil {
		return res, record.IOFailure(record.Position{File: path}, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return res, record.IOFailure(record.Position{File: path}, err)
	} else if !fi.Mode().IsRegular() {
		return res, record.IOFailure(record.Position{File: path}, errors.New("the segment is not a regular file"))
	}
	br := bufio.NewReaderSize(f, record.MaxLineBytes+1)
	// The epoch, for error positions: from the directory the file is in,
	// then from the origin its first record names.
	epoch, _ := logdir.ParseNumbered(filepath.Base(filepath.Dir(path)), "epoch-", "")
	sc := &segmentScan{path: path, trusted: trusted, vs: scan.Verifiers(trusted), res: res, lastCP: -1, sealAt: -1}
	for {
		raw, err := br.ReadSlice('\n')
		if e := logdir.EpochOfOrigin(res.Origin); e > 0 {
			epoch = e
		}
		sc.raw = raw
		sc.pos = record.Position{Epoch: epoch, File: path, Line: sc.no + 1, Offset: sc.off, Index: sc.seq}
		if errors.Is(err, bufio.ErrBufferFull) {
			return res, sc.fail(record.ClassIntegrity, "", "", "line is longer than %d bytes; no record is that large", record.MaxLineBytes)
		}
		if err == io.EOF {
			res.TornBytes = int64(len(raw))
			break
		}
		if err != nil {
			return res, record.IOFailure(sc.pos, err)
		}
		if err := sc.record(raw); err != nil {
			return res, err
		}
	}
	return sc.result(epoch)
}

// segmentScan is one VerifySegment: what the records read so far
// established, and the line being checked (raw, at pos).
type segmentScan struct {
	path    string
	trusted map[string]bool
	vs      note.Verifiers
	res     *SegmentResult

	fr      merkle.Frontier
	prev    tlog.Hash
	off, no int64
	seq     int64
	lastCP  int64 // index of the last checkpoint (-1: none)
	sealAt  int64 // index of the seal (-1: none)

	raw []byte
	pos record.Position
}

func (sc *segmentScan) fail(class record.Class, expected, computed, format string, args ...any) error {
	sc.pos.Record = scan.Excerpt(sc.raw)
	return &record.VerifyError{Class: class, Pos: sc.pos, Expected: expected, Computed: computed, Msg: fmt.Sprintf(format, args...)}
}

// record checks one complete line (raw, with its '\n') and adds it.
func (sc *segmentScan) record(raw []byte) error {
	res := sc.res
	sc.no++
	sc.off += int64(len(raw))
	line := raw[:len(raw)-1]
	e, perr := record.ParseLine(line)
	if perr != nil {
		return sc.fail(record.ClassIntegrity, "", "", "malformed record: %v", perr)
	}
	sc.pos.Kind = e.Kind
	h := tlog.RecordHash(line)
	if sc.no == 1 {
		if err := sc.first(&e); err != nil {
			return err
		}
	}
	seq := sc.seq
	if e.Seq != seq {
		return sc.fail(record.ClassIntegrity, fmt.Sprint(seq), fmt.Sprint(e.Seq), "sequence number %d, expected %d: a record was removed, duplicated or reordered", e.Seq, seq)
	}
	if e.Prev != sc.prev {
		return sc.fail(record.ClassIntegrity, scan.B64(e.Prev), scan.B64(sc.prev), "broken hash link: record %d was modified, or records between were removed", seq-1)
	}
	if sc.no > 1 && (e.Kind == record.KindGenesis || e.Kind == record.KindSegment) {
		return sc.fail(record.ClassIntegrity, "", string(e.Kind), "a %s record in the middle of a segment", e.Kind)
	}
	// As in a whole epoch: after a seal the writer writes its final
	// checkpoint and nothing else.
	if sc.sealAt >= 0 && (e.Kind != record.KindCheckpoint || seq > sc.sealAt+1) {
		return sc.fail(record.ClassIntegrity, "", string(e.Kind), "a %s record after the epoch's seal (record %d) and its final checkpoint: the writer writes nothing after closing an epoch", e.Kind, sc.sealAt)
	}
	if e.Kind == record.KindSeal {
		sc.sealAt = seq
	}
	if e.Kind == record.KindCheckpoint {
		if err := sc.checkpoint(&e); err != nil {
			return err
		}
	}
	sc.fr.Append(h)
	sc.prev = h
	sc.seq++
	res.Records++
	return nil
}

// first checks the file's first record: a genesis signed by a trusted key,
// or a segment record whose checkpoint and frontier the file continues.
func (sc *segmentScan) first(e *record.Envelope) error {
	res := sc.res
	sc.pos.Index = e.Seq
	switch e.Kind {
	case record.KindGenesis:
		r, err := record.DecodeBody(record.KindGenesis, e.Body)
		if err != nil {
			return sc.fail(record.ClassIntegrity, "", "", "%v", err)
		}
		g := r.(*record.Genesis)
		if !sc.trusted[g.Key] {
			return sc.fail(record.ClassKey, "", g.Key, "the segment's epoch is signed by key %s, which is not among the trusted keys (--key)", g.Key)
		}
		res.Origin = g.Origin
	case record.KindSegment:
		r, err := record.DecodeBody(record.KindSegment, e.Body)
		if err != nil {
			return sc.fail(record.ClassIntegrity, "", "", "%v", err)
		}
		s := r.(*record.Segment)
		cp, err := c2sp.OpenCheckpoint([]byte(s.Checkpoint), sc.vs)
		if err != nil {
			return sc.fail(classOfNoteErr(err), "", "", "the checkpoint that closed the previous segment: %v", err)
		}
		if s.FirstIndex != e.Seq || cp.Size != s.FirstIndex-1 {
			return sc.fail(record.ClassIntegrity, fmt.Sprint(s.FirstIndex-1), fmt.Sprint(cp.Size), "the segment record's first index and checkpoint do not line up")
		}
		if sc.fr, err = merkle.FrontierFrom(s.FirstIndex, s.Frontier); err != nil {
			return sc.fail(record.ClassIntegrity, "", "", "segment frontier: %v", err)
		}
		res.Origin = cp.Origin
		sc.seq, sc.prev = e.Seq, e.Prev
		sc.pos.Index = sc.seq
	default:
		return sc.fail(record.ClassIntegrity, "", string(e.Kind), "a segment file starts with a genesis or a segment record")
	}
	res.FirstIndex = sc.seq
	return nil
}

// checkpoint checks a checkpoint record against the key, the origin, its
// position and the tree.
func (sc *segmentScan) checkpoint(e *record.Envelope) error {
	res, seq := sc.res, sc.seq
	r, err := record.DecodeBody(record.KindCheckpoint, e.Body)
	if err != nil {
		return sc.fail(record.ClassIntegrity, "", "", "%v", err)
	}
	cp, err := c2sp.OpenCheckpoint([]byte(r.(*record.CheckpointRecord).Note), sc.vs)
	if err != nil {
		return sc.fail(classOfNoteErr(err), "", "", "checkpoint: %v", err)
	}
	if cp.Origin != res.Origin || cp.Size != seq {
		return sc.fail(record.ClassIntegrity, fmt.Sprintf("%s size %d", res.Origin, seq), fmt.Sprintf("%s size %d", cp.Origin, cp.Size), "checkpoint does not match its position")
	}
	if root := sc.fr.Root(); root != cp.Root {
		return sc.fail(record.ClassIntegrity, scan.B64(cp.Root), scan.B64(root), "Merkle root mismatch at size %d: the checkpoint signs one root, the frontier and records hash to another", cp.Size)
	}
	res.Checkpoints++
	res.LastCheckpoint = cp
	sc.lastCP = seq
	return nil
}

// result is what the whole file established: it fails when no checkpoint
// in the file signs any of its records.
func (sc *segmentScan) result(epoch int) (*SegmentResult, error) {
	res, path, seq, lastCP := sc.res, sc.path, sc.seq, sc.lastCP
	if res.Records == 0 {
		return res, &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{File: path}, Msg: "the segment holds no complete record"}
	}
	res.Epoch = epoch
	if lastCP < 0 {
		// The checkpoint the first record carries signs only records
		// before this file: nothing in the file is signed, and anyone
		// able to write it could have written every record after the
		// first.
		res.Unsealed = res.Records
		why := "the checkpoint its first record carries covers only records before the file"
		if res.FirstIndex == 0 {
			why = "its genesis record carries the epoch's key, but no checkpoint signed with it follows"
		}
		return res, &record.VerifyError{Class: record.ClassUnsigned, Pos: record.Position{Epoch: epoch, File: path, Line: 1, Index: res.FirstIndex},
			Msg:  fmt.Sprintf("the file holds no checkpoint: none of its records %d-%d is signed (%s)", res.FirstIndex, seq-1, why),
			Hint: "if the gateway is still writing this segment, verify it again after its next checkpoint; verify-chain DIR reports these records as the unsealed tail, or as UNSIGNED once a later epoch began"}
	}
	res.Unsealed = seq - lastCP - 1
	through := res.LastCheckpoint.Size - 1
	res.CoveredThrough = &through
	return res, nil
}

func classOfNoteErr(err error) record.Class {
	var uv *note.UnverifiedNoteError
	var bad *note.InvalidSignatureError
	switch {
	case errors.As(err, &bad):
		return record.ClassSignature
	case errors.As(err, &uv):
		return record.ClassKey
	case errors.Is(err, c2sp.ErrMalformedCheckpoint):
		return record.ClassIntegrity
	}
	return record.ClassSignature
}
