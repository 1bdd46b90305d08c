package auditlog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/merkle"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// VerifyOptions control Verify.
type VerifyOptions struct {
	// Keys are the trusted note verifier keys ("origin+hash+base64"). Each
	// epoch's genesis key must be one of them. Empty: each epoch is checked
	// against the key in its own genesis record and the report says that
	// trust was not established.
	Keys []string
	// Checkpoints are signed checkpoint notes kept outside the log (an
	// auditor's saved state, a witness). They detect truncation, rollback
	// and forks.
	Checkpoints [][]byte
	// VerifyEvidence, if set, checks each genesis record's attestation
	// evidence (bound to its key and statement); an error fails the epoch
	// with ClassKey.
	VerifyEvidence func(g *record.Genesis) error
	// Progress is called with the number of bytes verified since the last
	// call (see LogBytes for the total).
	Progress func(bytes int64)
	// OnRecord, if set, is called with every record once it has passed the
	// checks of its position (canonical form, sequence, hash link, kind
	// rules; a checkpoint after its signature and root), in log order, so
	// that a caller can read the log while it is verified instead of reading
	// it twice. Its Time is parsed. The *Entry is reused for the next
	// record: copy what you keep (Line and Body may be kept: they are not
	// overwritten). A record seen by OnRecord is not yet proven: a later
	// record can still fail the log (a broken link, a root that does not
	// match, a truncation found at the end), so nothing derived from the
	// records may be trusted before Verify returns without error. An error
	// from OnRecord stops Verify, which returns it unchanged.
	OnRecord func(e *Entry) error
	// Decode, if set, selects the kinds whose bodies are decoded ahead on
	// all cores for OnRecord: (*Entry).Decode then returns the decoded record
	// (or the decoding error) without decoding again.
	Decode func(k record.Kind) bool
	// RequireSigned fails the log (ClassUnsigned) when an epoch before the
	// newest holds records that no checkpoint signed by its own key covers:
	// the tail of an epoch whose writer stopped before signing it. The next
	// epoch's genesis records those records as they were on disk when it
	// started; it cannot tell who wrote them. Without it they are reported
	// in Report.Unsigned and a warning.
	RequireSigned bool
	// Strict fails the log (ClassIntegrity) when its directory holds
	// entries that are not part of it (Report.Stray). Without it each is
	// a warning.
	Strict bool
	// Witnesses are cosignature verifier keys (c2sp.org/tlog-cosignature,
	// "<name>+<hash>+<base64(0x04||key)>") of the witnesses the auditor
	// trusts. With them the newest checkpoint of the log, as a log
	// checkpoint (FORMAT.md section 11), must carry WitnessQuorum valid
	// cosignatures of theirs (default: all of them); any cosignature of
	// theirs anywhere in the log that does not verify fails the log.
	Witnesses     []string
	WitnessQuorum int
	// WitnessMaxAge, if set, also requires the quorum's cosignatures on
	// the newest checkpoint to be at most that old (Now, default time.Now).
	WitnessMaxAge time.Duration
	Now           func() time.Time
}

// UnsignedRange is a run of records that no signature of their epoch's key
// covers, in an epoch before the newest (see VerifyOptions.RequireSigned).
type UnsignedRange struct {
	Epoch int   `json:"epoch"`
	First int64 `json:"first"` // record index
	Last  int64 `json:"last"`
	// By is the epoch whose genesis recorded them as its predecessor's.
	By int `json:"recorded_by_epoch"`
}

// ExternalCheck is the outcome of checking the log against one external checkpoint.
type ExternalCheck struct {
	Origin  string `json:"origin"`
	Size    int64  `json:"size"`
	Root    string `json:"root"`
	Epoch   int    `json:"epoch"`
	Records int64  `json:"records"` // records of that epoch in the log
}

// Report is what Verify established.
type Report struct {
	Dir         string         `json:"dir"`
	Epochs      []*EpochResult `json:"epochs"`
	Records     int64          `json:"records"` // all records, signed or not
	Checkpoints int            `json:"checkpoints"`
	First       time.Time      `json:"first"`
	Last        time.Time      `json:"last"`
	// SignedRecords counts the records of every epoch up to its last
	// checkpoint (Records less the unsealed tail and the Unsigned
	// ranges); SignedFirst and SignedLast are the times of the first and
	// the last record a checkpoint signs.
	SignedRecords           int64            `json:"signed_records"`
	SignedFirst, SignedLast time.Time        `json:"-"`
	KeysTrusted             bool             `json:"keys_trusted"` // every epoch key was among the --key keys
	Newest                  *c2sp.Checkpoint `json:"-"`            // newest in-band checkpoint: the last one of the newest epoch that has one
	NewestEpoch             int              `json:"newest_epoch"` // the epoch of Newest (0: no checkpoint in the log)
	Unsealed                int64            `json:"unsealed"`     // records of the newest epoch after its last checkpoint
	Unsigned                []UnsignedRange  `json:"unsigned"`     // records of earlier epochs that no signature of theirs covers
	External                []*ExternalCheck `json:"external"`
	Warnings                []string         `json:"warnings"`
	// Stray lists the files and directories in the log's directory and
	// its epoch directories that are not part of the log, and so were not
	// verified (a segment copied aside, a name with seven digits, an epoch
	// directory renamed): relative to Dir, with forward slashes, sorted.
	Stray []string `json:"stray"`
	// Log is the log identity and its witnessed checkpoints (nil when no
	// epoch names a log identity).
	Log *LogReport `json:"log,omitempty"`
}

// LogBytes returns the total size of the segment files under dir (for a
// progress bar).
func LogBytes(dir string) int64 {
	var n int64
	epochs, _ := logdir.ListEpochs(dir)
	for _, e := range epochs {
		ed := filepath.Join(dir, logdir.EpochName(e))
		segs, _ := logdir.ListSegments(ed)
		for _, s := range segs {
			if fi, err := os.Stat(filepath.Join(ed, logdir.SegmentName(s))); err == nil && fi.Mode().IsRegular() {
				n += fi.Size()
			}
		}
	}
	return n
}

// ParseKeys checks note verifier keys and returns them as a set.
func ParseKeys(keys []string) (map[string]bool, error) {
	set := make(map[string]bool)
	for _, k := range keys {
		k = strings.TrimSpace(k)
		v, err := note.NewVerifier(k)
		if err != nil {
			return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("key %q is not a note verifier key (want origin+hash+base64): %v", clip(k), err)}
		}
		_ = v
		set[k] = true
	}
	return set, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// Verify checks every epoch of the audit directory dir. It returns the
// report and, on the first failure, a *VerifyError with its location.
func Verify(dir string, opt VerifyOptions) (*Report, error) {
	v := &verification{dir: dir, opt: opt, rep: &Report{Dir: dir}}
	rep := v.rep
	if err := v.start(); err != nil {
		return rep, err
	}
	lc, err := newLogCheck(&v.opt, dir, v.epochs)
	if err != nil {
		return rep, err
	}
	v.lc = lc
	if err := v.scanEpochs(); err != nil {
		return rep, err
	}
	last := rep.Epochs[len(rep.Epochs)-1]
	for _, r := range rep.Epochs {
		if r.LastCheckpoint != nil {
			rep.Newest, rep.NewestEpoch = r.LastCheckpoint, r.Epoch
		}
	}
	rep.Unsealed = last.Unsealed
	rep.KeysTrusted = v.trusted != nil

	if err := v.external(); err != nil {
		return rep, err
	}
	if err := v.unsigned(); err != nil {
		return rep, err
	}
	if err := v.stray(); err != nil {
		return rep, err
	}
	if err := lc.finish(rep); err != nil {
		return rep, err
	}
	v.warn(last)
	return rep, nil
}

// verification is one Verify: the options as parsed, and the report so
// far.
type verification struct {
	dir       string
	opt       VerifyOptions
	rep       *Report
	trusted   map[string]bool
	exts      []savedCheckpoint // --checkpoint
	wantRoots map[string]map[int64]*tlog.Hash
	epochs    []int
	lc        *logCheck
}

// savedCheckpoint is a checkpoint kept outside the log (--checkpoint).
type savedCheckpoint struct {
	cp  *c2sp.Checkpoint
	raw []byte
}

// start checks the directory and parses the keys and saved checkpoints.
func (v *verification) start() error {
	dir, opt := v.dir, &v.opt
	fi, err := os.Stat(dir)
	if err != nil {
		return record.IOFailure(record.Position{}, err)
	}
	if !fi.IsDir() {
		return &record.VerifyError{Class: record.ClassNotLog, Msg: fmt.Sprintf("%s is not a directory; give the audit directory (the one holding epoch-NNNNNN/)", dir)}
	}
	if len(opt.Keys) > 0 {
		if v.trusted, err = ParseKeys(opt.Keys); err != nil {
			return err
		}
	}
	wantRoots := map[string]map[int64]*tlog.Hash{}
	for i, raw := range opt.Checkpoints {
		cp, err := c2sp.ParseCheckpoint(raw)
		if err != nil {
			return &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("external checkpoint %d: %v", i+1, err)}
		}
		v.exts = append(v.exts, savedCheckpoint{cp, raw})
		if wantRoots[cp.Origin] == nil {
			wantRoots[cp.Origin] = map[int64]*tlog.Hash{}
		}
		wantRoots[cp.Origin][cp.Size] = nil
	}
	v.wantRoots = wantRoots
	epochs, err := logdir.ListEpochs(dir)
	if err != nil {
		return record.IOFailure(record.Position{}, err)
	}
	v.epochs = epochs
	if len(epochs) == 0 {
		if len(v.exts) > 0 {
			return &record.VerifyError{Class: record.ClassTruncation, Expected: fmt.Sprint(v.exts[0].cp.Size), Computed: "0",
				Msg:  fmt.Sprintf("%s holds no epochs, but the saved checkpoint commits to %d records of %s: the log was deleted", dir, v.exts[0].cp.Size, v.exts[0].cp.Origin),
				Hint: "restore the audit directory from a backup"}
		}
		ve := &record.VerifyError{Class: record.ClassNotLog, Msg: fmt.Sprintf("%s is not an audit log: it holds no epoch-NNNNNN directories", dir),
			Hint: "give the directory cmcp serve writes its audit log to (audit.dir in cmcp.yaml)"}
		if segs, _ := logdir.ListSegments(dir); len(segs) > 0 {
			ve.Hint = fmt.Sprintf("%s looks like one epoch of a log; give the audit directory above it: %s", dir, filepath.Dir(filepath.Clean(dir)))
		}
		return ve
	}
	return nil
}

// scanEpochs verifies each epoch and the chain of epochs: each genesis
// names its predecessor as the directory holds it.
func (v *verification) scanEpochs() error {
	dir, opt, rep, lc, epochs := v.dir, &v.opt, v.rep, v.lc, v.epochs
	trusted, wantRoots := v.trusted, v.wantRoots
	for i, e := range epochs {
		base := lc.fr.Clone()
		var d scan.Detail
		res, err := scan.Epoch(dir, e, scan.Options{Trusted: trusted, WantRoots: wantRoots, Progress: opt.Progress, Evidence: opt.VerifyEvidence, OnRecord: opt.OnRecord, Decode: opt.Decode, OnLeaf: lc.leaf, Detail: &d})
		if err != nil && d.Empty && i > 0 && i == len(epochs)-1 {
			// The newest epoch holds no complete record: a start that
			// stopped before its genesis was durable (or one under way).
			// Nothing in it was acknowledged, and the writer's recovery
			// moves it aside: the log is the epochs before it. (Treating
			// it so hides nothing that deleting the epoch would not: both
			// are caught only by a saved checkpoint of its origin, and it
			// has none.)
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("epoch %d (%s) holds no complete record: an aborted start, which stopped before its genesis record was durable, or a start under way; nothing in it was acknowledged, and the next start moves it aside as aborted-%s-<time>", e, res.Dir, logdir.EpochName(e)))
			break
		}
		rep.Epochs = append(rep.Epochs, res)
		if err != nil {
			var ve *record.VerifyError
			if d.Empty && len(epochs) == 1 && errors.As(err, &ve) && ve.Hint == "" {
				ve.Hint = "if the gateway's first start failed before its genesis record was durable (a full disk), this is what it left: the next start moves the epoch aside and begins again; there is no record to verify"
			}
			return err
		}
		if err := lc.genesis(res, base); err != nil {
			return err
		}
		rep.count(res)
		g := res.Genesis
		gpos := record.Position{Epoch: e, File: filepath.Join(res.Dir, logdir.SegmentName(1)), Line: 1, Index: 0, Kind: record.KindGenesis}
		if i == 0 {
			if g.Predecessor != nil {
				return &record.VerifyError{Class: record.ClassTruncation, Pos: gpos,
					Msg:  fmt.Sprintf("epoch %d names a predecessor (epoch %d, %s, %d records) that is not in the directory: earlier epochs were deleted", e, g.Predecessor.Epoch, g.Predecessor.Origin, g.Predecessor.Size),
					Hint: "verify the complete audit directory, or restore the missing epochs"}
			}
			continue
		}
		prev := rep.Epochs[i-1]
		p := g.Predecessor
		if prev.TornBytes > 0 {
			return &record.VerifyError{Class: record.ClassIntegrity, Pos: *prev.TornAt,
				Msg: fmt.Sprintf("epoch %d ends with an incomplete line of %d bytes, but epoch %d follows it: the writer's recovery cuts such a line before it starts a new epoch, so it was added afterwards", prev.Epoch, prev.TornBytes, e)}
		}
		switch {
		case e != epochs[i-1]+1:
			return &record.VerifyError{Class: record.ClassTruncation, Pos: gpos, Expected: logdir.EpochName(e - 1), Computed: logdir.EpochName(epochs[i-1]),
				Msg: fmt.Sprintf("epoch %d is missing: the directory goes from epoch %d to epoch %d", e-1, epochs[i-1], e)}
		case p == nil:
			return &record.VerifyError{Class: record.ClassIntegrity, Pos: gpos, Msg: fmt.Sprintf("epoch %d's genesis names no predecessor, but epoch %d precedes it", e, prev.Epoch)}
		case p.Epoch != prev.Epoch || p.Origin != prev.Origin:
			return &record.VerifyError{Class: record.ClassIntegrity, Pos: gpos, Expected: p.Origin, Computed: prev.Origin,
				Msg: fmt.Sprintf("epoch %d's genesis names predecessor %s (epoch %d), but the directory holds %s", e, p.Origin, p.Epoch, prev.Origin)}
		case p.Size > prev.Records:
			return &record.VerifyError{Class: record.ClassTruncation, Pos: gpos, Expected: fmt.Sprint(p.Size), Computed: fmt.Sprint(prev.Records),
				Msg:  fmt.Sprintf("epoch %d had %d records when epoch %d began, now it has %d: %d records were cut from its tail", prev.Epoch, p.Size, e, prev.Records, p.Size-prev.Records),
				Hint: "restore the epoch from a backup; the records are lost from this copy"}
		case p.Size < prev.Records:
			return &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Epoch: prev.Epoch, Index: p.Size}, Expected: fmt.Sprint(p.Size), Computed: fmt.Sprint(prev.Records),
				Msg: fmt.Sprintf("epoch %d has %d records but had %d when epoch %d began: %d records were appended to it afterwards", prev.Epoch, prev.Records, p.Size, e, prev.Records-p.Size)}
		case !bytes.Equal(p.Root, prev.Root[:]):
			return &record.VerifyError{Class: record.ClassIntegrity, Pos: gpos, Expected: b64h(p.Root), Computed: scan.B64(prev.Root),
				Msg: fmt.Sprintf("epoch %d's records hash to another root than epoch %d's genesis recorded: epoch %d was changed after it ended", prev.Epoch, e, prev.Epoch)}
		case p.Sealed != prev.Sealed:
			return &record.VerifyError{Class: record.ClassIntegrity, Pos: gpos, Msg: fmt.Sprintf("epoch %d's genesis says epoch %d was sealed=%v, the log says %v", e, prev.Epoch, p.Sealed, prev.Sealed)}
		}
		if r := res.Recovery; r != nil && (r.Epoch != prev.Epoch || r.Records != prev.Records || !bytes.Equal(r.Root, prev.Root[:])) {
			return &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Epoch: e}, Msg: fmt.Sprintf("epoch %d's recovery record does not describe epoch %d as it is now", e, prev.Epoch)}
		}
	}
	return nil
}

// count adds an epoch's records, checkpoints and times to the report's.
func (rep *Report) count(res *EpochResult) {
	rep.Records += res.Records
	rep.Checkpoints += res.Checkpoints
	if rep.First.IsZero() {
		rep.First = res.First
	}
	if !res.Last.IsZero() {
		rep.Last = res.Last
	}
	rep.SignedRecords += res.Signed
	if rep.SignedFirst.IsZero() {
		rep.SignedFirst = res.SignedFirst
	}
	if !res.SignedLast.IsZero() {
		rep.SignedLast = res.SignedLast
	}
}

// external checks the saved checkpoints (--checkpoint) against the
// epochs they name: signed by a trusted key, no records cut, no fork.
func (v *verification) external() error {
	rep, trusted, wantRoots := v.rep, v.trusted, v.wantRoots
	for _, x := range v.exts {
		ec := &ExternalCheck{Origin: x.cp.Origin, Size: x.cp.Size, Root: scan.B64(x.cp.Root)}
		rep.External = append(rep.External, ec)
		var er *EpochResult
		for _, r := range rep.Epochs {
			if r.Origin == x.cp.Origin {
				er = r
			}
		}
		var vs note.Verifiers
		switch {
		case trusted != nil:
			vs = scan.Verifiers(trusted)
		case er != nil:
			v, _ := note.NewVerifier(er.Key)
			vs = note.VerifierList(v)
		}
		if vs != nil {
			if _, err := c2sp.OpenCheckpoint(x.raw, vs); err != nil {
				var uv *note.UnverifiedNoteError
				var bad *note.InvalidSignatureError
				switch {
				case errors.As(err, &bad):
					return &record.VerifyError{Class: record.ClassSignature, Msg: fmt.Sprintf("the saved checkpoint (%s, size %d) has a bad signature: %v", x.cp.Origin, x.cp.Size, err)}
				case errors.As(err, &uv):
					return &record.VerifyError{Class: record.ClassKey, Msg: fmt.Sprintf("the saved checkpoint (%s, size %d) is not signed by a trusted key (signed by %s)", x.cp.Origin, x.cp.Size, scan.SigNames(uv.Note))}
				default:
					return &record.VerifyError{Class: record.ClassSignature, Msg: fmt.Sprintf("the saved checkpoint: %v", err)}
				}
			}
		}
		if er == nil {
			ve := &record.VerifyError{Class: record.ClassTruncation, Expected: x.cp.Origin,
				Msg:  fmt.Sprintf("the saved checkpoint commits to %d records of %s, but no epoch of this log has that origin: the epoch was deleted or replaced", x.cp.Size, x.cp.Origin),
				Hint: "restore the missing epoch from a backup"}
			if vs == nil {
				ve.Msg += " (the checkpoint's signature was not checked: no --key and no epoch to take a key from)"
			}
			if n := logdir.EpochOfOrigin(x.cp.Origin); n > 0 {
				for _, r := range rep.Epochs {
					if r.Epoch == n {
						ve.Class = record.ClassFork
						ve.Pos = record.Position{Epoch: n}
						ve.Computed = r.Origin
						ve.Msg = fmt.Sprintf("the saved checkpoint is for %s, but %s now holds another history (%s): the epoch was regenerated", x.cp.Origin, logdir.EpochName(n), r.Origin)
						ve.Hint = "treat the log as rewritten; keep both the saved checkpoint and the directory as evidence"
					}
				}
			}
			return ve
		}
		ec.Epoch, ec.Records = er.Epoch, er.Records
		if x.cp.Size > er.Records {
			return &record.VerifyError{Class: record.ClassTruncation, Pos: record.Position{Epoch: er.Epoch, Index: er.Records}, Expected: fmt.Sprint(x.cp.Size), Computed: fmt.Sprint(er.Records),
				Msg:  fmt.Sprintf("epoch %d has %d records but the saved checkpoint commits to %d: %d records were removed from its tail (truncation or rollback)", er.Epoch, er.Records, x.cp.Size, x.cp.Size-er.Records),
				Hint: "restore the epoch from a backup; the saved checkpoint proves the missing records existed"}
		}
		var root tlog.Hash
		if x.cp.Size == 0 {
			root = (&merkle.Frontier{}).Root()
		} else if r := wantRoots[x.cp.Origin][x.cp.Size]; r != nil {
			root = *r
		}
		if root != x.cp.Root {
			return &record.VerifyError{Class: record.ClassFork, Pos: record.Position{Epoch: er.Epoch, Index: x.cp.Size}, Expected: scan.B64(x.cp.Root), Computed: scan.B64(root),
				Msg:  fmt.Sprintf("SECURITY ERROR: fork: the first %d records of epoch %d hash to another root than the saved checkpoint signs; this log is not an extension of what was seen before.\nsaved checkpoint:\n%s", x.cp.Size, er.Epoch, indent(string(x.raw))),
				Hint: "the history was rewritten by someone holding the key; keep both the saved checkpoint and this directory as evidence"}
		}
	}

	return nil
}

// unsigned reports the records of crashed epochs that no key signed, and
// fails on them with RequireSigned.
func (v *verification) unsigned() error {
	rep, opt := v.rep, &v.opt
	// Crashed epochs. Records after an epoch's last checkpoint were never
	// signed by its key: the next epoch's genesis fixes them as they were
	// on disk when it started (a later change is caught, once a checkpoint
	// of the next epoch signs that genesis), but whoever could write the
	// disk before that could have written them.
	rep.Unsigned = []UnsignedRange{}
	for i, r := range rep.Epochs[:len(rep.Epochs)-1] {
		next := rep.Epochs[i+1]
		cut := next.Recovery != nil && next.Recovery.DroppedBytes > 0
		if r.Sealed && !cut {
			continue
		}
		msg := fmt.Sprintf("epoch %d was not sealed (the writer stopped without closing it)", r.Epoch)
		if r.Sealed {
			msg = fmt.Sprintf("epoch %d was sealed, but bytes followed its final checkpoint (the writer writes nothing there)", r.Epoch)
		}
		if r.Unsealed > 0 {
			u := UnsignedRange{Epoch: r.Epoch, First: r.LastCheckpointAt + 1, Last: r.Records - 1, By: next.Epoch}
			rep.Unsigned = append(rep.Unsigned, u)
			// The next genesis binds them only once a checkpoint of the
			// next epoch signs that genesis (any checkpoint does).
			binding := fmt.Sprintf("Epoch %d's signed genesis fixes them as they were on disk when it started; it does not prove the gateway wrote them", next.Epoch)
			if next.Checkpoints == 0 {
				binding = fmt.Sprintf("Epoch %d's genesis records them as they were on disk when it started, but no checkpoint of epoch %d signs its genesis, so that record of them is itself unsigned; neither proves the gateway wrote them", next.Epoch, next.Epoch)
			}
			msg += fmt.Sprintf("; UNSIGNED: its records %d-%d (%d) come after its last checkpoint and were never signed by its key. %s: anyone able to write the disk before that restart could have altered or added them (--require-signed fails the log on such records)",
				u.First, u.Last, r.Unsealed, binding)
		}
		if rc := next.Recovery; cut {
			msg += fmt.Sprintf("; when epoch %d started, %d bytes of an incomplete or damaged tail were cut from %s at byte %d (sha256 %x), kept as %s: %s", next.Epoch, rc.DroppedBytes, rc.File, rc.Offset, rc.DroppedSHA256, rc.SavedAs, rc.Reason)
		}
		rep.Warnings = append(rep.Warnings, msg)
	}
	if opt.RequireSigned && len(rep.Unsigned) > 0 {
		u := rep.Unsigned[0]
		return &record.VerifyError{Class: record.ClassUnsigned, Pos: record.Position{Epoch: u.Epoch, Index: u.First},
			Msg:  fmt.Sprintf("records %d-%d of epoch %d are not signed by the epoch's key (the writer stopped before signing them); epoch %d's genesis only records that they were on disk when it started", u.First, u.Last, u.Epoch, u.By),
			Hint: "without --require-signed the log verifies with these records reported as unsigned; whether to trust them depends on who could write the audit disk while the gateway was down"}
	}

	return nil
}

// stray reports what the directory holds that is not part of the log,
// and fails on it with Strict.
func (v *verification) stray() error {
	dir, opt, rep, epochs := v.dir, &v.opt, v.rep, v.epochs
	stray, err := logdir.StrayEntries(dir, epochs)
	if err != nil {
		return record.IOFailure(record.Position{}, err)
	}
	rep.Stray = stray
	for _, p := range stray {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s is not part of the log and was not verified: only epoch-NNNNNN/seg-NNNNNN.jsonl files are (six digits); a copy of a segment or an epoch under another name proves nothing (move it out of the audit directory)", filepath.FromSlash(p)))
	}
	if opt.Strict && len(stray) > 0 {
		return &record.VerifyError{Class: record.ClassIntegrity,
			Msg:  fmt.Sprintf("%s holds %d entries that are not part of the log (--strict): %s", dir, len(stray), strings.Join(stray, ", ")),
			Hint: "move them out of the audit directory; without --strict each is a warning"}
	}
	return nil
}

// warn adds the warnings of what was not established; last is the
// newest epoch's result.
func (v *verification) warn(last *EpochResult) {
	rep, trusted, exts := v.rep, v.trusted, v.exts
	witnessed := rep.Log != nil && rep.Log.Witnessed != nil

	// Warnings: what was not established.
	if trusted == nil {
		rep.Warnings = append(rep.Warnings, "trust not established: no --key given, so each epoch was checked against the key in its own genesis record; anyone able to rewrite the whole directory could have produced it (pass the gateway's key with --key, or check the genesis attestation)")
	}
	if len(exts) == 0 && !witnessed {
		rep.Warnings = append(rep.Warnings, "truncation of the tail cannot be detected without a checkpoint kept outside the log: a log cut after its last checkpoint, or whose newest epoch was deleted, verifies as complete (save one with --save-checkpoint and pass it with --checkpoint next time)")
	}
	if last.Unsealed > 0 {
		first := last.LastCheckpointAt + 1
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("unsealed tail: %d records of epoch %d (records %d-%d) come after the last checkpoint and are not covered by any signature; anyone with write access could have appended them", last.Unsealed, last.Epoch, first, last.Records-1))
	}
	if last.TornBytes > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("epoch %d ends with an incomplete line of %d bytes (%s:%d, byte %d): the writer stopped mid-write; the next start cuts it", last.Epoch, last.TornBytes, last.TornAt.File, last.TornAt.Line, last.TornAt.Offset))
	}
	if !last.Sealed {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("epoch %d is not sealed: the gateway is still running, or it stopped without closing the log", last.Epoch))
	}
}

func b64h(b []byte) string {
	if len(b) != tlog.HashSize {
		return fmt.Sprintf("%x", b)
	}
	return scan.B64(tlog.Hash(b))
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}
