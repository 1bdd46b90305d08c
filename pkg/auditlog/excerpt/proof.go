package excerpt

import (
	"errors"
	"fmt"
	"slices"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// A proof carries a record line and a checkpoint: c2sp.MaxProofBytes is
// twice MaxLineBytes (this does not compile if the two drift apart).
var _ = [1]struct{}{}[c2sp.MaxProofBytes-2*record.MaxLineBytes]

// ProofResult is what VerifyProof established.
type ProofResult struct {
	Index      int64
	Kind       record.Kind
	Checkpoint *c2sp.Checkpoint
	Record     []byte
}

// VerifyProof checks an offline proof against trusted note verifier keys:
// the checkpoint signature, that the index is inside the checkpoint, that
// the record is well-formed and carries that index, and the inclusion of
// its leaf hash under the checkpoint's root.
func VerifyProof(text []byte, keys []string) (*ProofResult, error) {
	p, err := c2sp.ParseProof(text)
	if err != nil {
		return nil, &record.VerifyError{Class: record.ClassIntegrity, Msg: err.Error(), Err: err}
	}
	set, err := auditlog.ParseKeys(keys)
	if err != nil {
		return nil, err
	}
	if len(set) == 0 {
		return nil, &record.VerifyError{Class: record.ClassUsage, Msg: "checking a proof needs the trusted key (--key): the proof carries no key of its own"}
	}
	cp, err := c2sp.OpenCheckpoint(p.Checkpoint, scan.Verifiers(set))
	if err != nil {
		var uv *note.UnverifiedNoteError
		var bad *note.InvalidSignatureError
		switch {
		case errors.As(err, &bad):
			return nil, &record.VerifyError{Class: record.ClassSignature, Pos: record.Position{Index: p.Index}, Msg: fmt.Sprintf("the proof's checkpoint signature does not verify: %v", err)}
		case errors.As(err, &uv):
			return nil, &record.VerifyError{Class: record.ClassKey, Pos: record.Position{Index: p.Index}, Msg: fmt.Sprintf("the proof's checkpoint is not signed by a trusted key (signed by %s)", scan.SigNames(uv.Note))}
		}
		return nil, &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Index: p.Index}, Msg: fmt.Sprintf("the proof's checkpoint: %v", err)}
	}
	res := &ProofResult{Index: p.Index, Checkpoint: cp, Record: p.Record}
	pos := record.Position{Epoch: logdir.EpochOfOrigin(cp.Origin), Index: p.Index, Record: scan.Excerpt(p.Record)}
	if p.Index >= cp.Size {
		return res, &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Msg: fmt.Sprintf("record %d is not covered by the checkpoint (size %d)", p.Index, cp.Size)}
	}
	env, err := record.ParseLine(p.Record)
	if err != nil {
		return res, &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Msg: fmt.Sprintf("the proof's record is malformed: %v", err)}
	}
	res.Kind = env.Kind
	if env.Seq != p.Index {
		return res, &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Expected: fmt.Sprint(p.Index), Computed: fmt.Sprint(env.Seq), Msg: "the record's seq differs from the proof's index"}
	}
	if err := tlog.CheckRecord(p.Hashes, cp.Size, cp.Root, p.Index, tlog.RecordHash(p.Record)); err != nil {
		return res, &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Expected: scan.B64(cp.Root), Msg: fmt.Sprintf("inclusion proof does not verify: the record, its index or the proof hashes were changed (%v)", err)}
	}
	return res, nil
}

// Prove builds an offline proof for record index of the given epoch (0:
// the newest) against the newest checkpoint of that epoch. The epoch is
// verified first; opt is as for Verify.
func Prove(dir string, epoch int, index int64, opt auditlog.VerifyOptions) (*c2sp.Proof, error) {
	if epoch < 0 {
		return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("epoch %d: epochs are numbered from 1 (0: the newest)", epoch)}
	}
	epochs, err := logdir.ListEpochs(dir)
	if err != nil {
		return nil, record.IOFailure(record.Position{}, err)
	}
	if len(epochs) == 0 {
		return nil, &record.VerifyError{Class: record.ClassNotLog, Msg: fmt.Sprintf("%s is not an audit log: it holds no epoch-NNNNNN directories", dir)}
	}
	newest := epoch == 0
	if newest {
		epoch = epochs[len(epochs)-1]
	} else if !slices.Contains(epochs, epoch) {
		return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("%s has epochs %d-%d; there is no epoch %d", dir, epochs[0], epochs[len(epochs)-1], epoch)}
	}
	var trusted map[string]bool
	if len(opt.Keys) > 0 {
		var err error
		if trusted, err = auditlog.ParseKeys(opt.Keys); err != nil {
			return nil, err
		}
	}
	// closed: a later epoch began after this one, so no checkpoint of its
	// key will ever be added to it.
	closed := epoch != epochs[len(epochs)-1]
	var d scan.Detail
	res, err := scan.Epoch(dir, epoch, scan.Options{Trusted: trusted, KeepLeaves: true, Progress: opt.Progress, Evidence: opt.VerifyEvidence, Detail: &d})
	if err != nil && d.Empty && newest && len(epochs) > 1 {
		// An aborted start (see Verify): the newest epoch is the one before.
		epoch = epochs[len(epochs)-2]
		res, err = scan.Epoch(dir, epoch, scan.Options{Trusted: trusted, KeepLeaves: true, Progress: opt.Progress, Evidence: opt.VerifyEvidence})
	}
	if err != nil {
		return nil, err
	}
	if index < 0 || index >= res.Records {
		return nil, &record.VerifyError{Class: record.ClassUsage, Pos: record.Position{Epoch: epoch}, Msg: fmt.Sprintf("epoch %d has records 0-%d; there is no record %d", epoch, res.Records-1, index)}
	}
	cp := res.LastCheckpoint
	if closed && !res.Sealed && (cp == nil || index > cp.Size) {
		// The tail a crashed epoch left (Verify reports it UNSIGNED).
		first := int64(0)
		if cp != nil {
			first = cp.Size + 1
		}
		return nil, &record.VerifyError{Class: record.ClassUnsigned, Pos: record.Position{Epoch: epoch, Index: index},
			Msg: fmt.Sprintf("record %d is one of the records %d-%d that crashed epoch %d left UNSIGNED: the writer stopped before a checkpoint of its key covered them, and a later epoch began, so none ever will: no proof can exist", index, first, res.Records-1, epoch)}
	}
	if cp == nil {
		return nil, &record.VerifyError{Class: record.ClassUsage, Pos: record.Position{Epoch: epoch, Index: index}, Msg: fmt.Sprintf("epoch %d has no checkpoint yet", epoch)}
	}
	if index == cp.Size && (res.Sealed || closed) {
		return nil, &record.VerifyError{Class: record.ClassUsage, Pos: record.Position{Epoch: epoch, Index: index},
			Msg: fmt.Sprintf("record %d is epoch %d's last checkpoint: a checkpoint is covered only by a later one, and none follows (prove a record before it, 0-%d)", index, epoch, cp.Size-1)}
	}
	if index >= cp.Size {
		return nil, &record.VerifyError{Class: record.ClassUsage, Pos: record.Position{Epoch: epoch, Index: index},
			Msg: fmt.Sprintf("record %d is in the unsealed tail of epoch %d: no checkpoint covers it yet (the last one covers records 0-%d)", index, epoch, cp.Size-1)}
	}
	st, err := storeOf(res.Leaves[:cp.Size])
	if err != nil {
		return nil, err
	}
	hashes, err := tlog.ProveRecord(cp.Size, index, st)
	if err != nil {
		return nil, fmt.Errorf("build the inclusion proof: %w", err)
	}
	line, err := readRecordLine(dir, epoch, index)
	if err != nil {
		return nil, err
	}
	return &c2sp.Proof{Record: line, Index: index, Hashes: hashes, Checkpoint: cp.Note}, nil
}

// memStore is a tlog.HashReader over the stored hashes of a tree.
type memStore []tlog.Hash

// storeOf returns the stored hashes of the tree over leaves.
func storeOf(leaves []tlog.Hash) (memStore, error) {
	st := make(memStore, 0, 2*len(leaves))
	for i, l := range leaves {
		hs, err := tlog.StoredHashesForRecordHash(int64(i), l, st)
		if err != nil {
			return nil, err
		}
		st = append(st, hs...)
	}
	return st, nil
}

func (m memStore) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		if x < 0 || x >= int64(len(m)) {
			return nil, fmt.Errorf("stored hash %d out of range", x)
		}
		out[i] = m[x]
	}
	return out, nil
}

// readRecordLine returns the line of record index in an epoch.
func readRecordLine(dir string, epoch int, index int64) ([]byte, error) {
	r, err := auditlog.NewReader(dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	for {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("find record %d of epoch %d: %w", index, epoch, err)
		}
		if e.Pos.Epoch == epoch && e.Index == index {
			return e.Line, nil
		}
	}
}
