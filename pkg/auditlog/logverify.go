package auditlog

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
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

// LogReport is what Verify established about the log identity and its
// witnessed log checkpoints (FORMAT.md section 11).
type LogReport struct {
	Origin string `json:"origin"`
	Key    string `json:"key"`
	Size   int64  `json:"size"` // log tree size: every record of every epoch
	// Cosigned counts the log checkpoints in witness.jsonl files (all
	// verified: the log key's signature, the root, every cosignature of a
	// given witness).
	Cosigned int `json:"cosigned_checkpoints"`
	// Witnessed is the newest checkpoint record of the log as a log
	// checkpoint, with the witnesses whose cosignatures on it verify.
	Witnessed *WitnessedCheckpoint `json:"witnessed,omitempty"`
}

// WitnessedCheckpoint is a log checkpoint and the witnesses that cosigned it.
type WitnessedCheckpoint struct {
	Size      int64     `json:"size"`
	Root      string    `json:"root"`
	Epoch     int       `json:"epoch"`
	Index     int64     `json:"index"` // the epoch checkpoint record it follows
	Witnesses []string  `json:"witnesses"`
	Quorum    int       `json:"quorum"`
	Time      time.Time `json:"time"` // the quorum's oldest cosignature time among the newest ones (freshness)
	Note      string    `json:"note"` // with every verified cosignature
}

// logCheck carries the log tree through Verify.
type logCheck struct {
	opt       *VerifyOptions
	wits      []note.Verifier
	fr        merkle.Frontier
	want      map[int64]*tlog.Hash
	cosigned  []cosignedAt
	bases     map[int]int64
	id        *record.LogInfo // the identity of the newest epoch that has one
	idEpoch   int
	lastWithL int // newest epoch with a log member
}

type cosignedAt struct {
	epoch int
	line  int
	raw   []byte
	cp    *c2sp.Checkpoint
}

func newLogCheck(opt *VerifyOptions, dir string, epochs []int) (*logCheck, error) {
	lc := &logCheck{opt: opt, want: map[int64]*tlog.Hash{}, bases: map[int]int64{}}
	seen := map[string]bool{}
	for _, k := range opt.Witnesses {
		v, err := c2sp.NewCosignatureVerifier(strings.TrimSpace(k))
		if err != nil {
			return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("--witness: %v", err)}
		}
		id := fmt.Sprintf("%s+%08x", v.Name(), v.KeyHash())
		if seen[id] {
			return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("--witness %s is given twice: a quorum counts distinct witnesses", clip(k))}
		}
		seen[id] = true
		lc.wits = append(lc.wits, v)
	}
	if opt.WitnessQuorum < 0 || opt.WitnessQuorum > len(lc.wits) {
		return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("--witness-quorum %d: want 1 to the number of --witness keys (%d)", opt.WitnessQuorum, len(lc.wits))}
	}
	if len(lc.wits) > 0 && opt.WitnessQuorum == 0 {
		opt.WitnessQuorum = len(lc.wits)
	}
	for _, e := range epochs {
		notes, err := logdir.ReadCosigned(filepath.Join(dir, logdir.EpochName(e)))
		if err != nil {
			return nil, &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Epoch: e, File: filepath.Join(dir, logdir.EpochName(e), WitnessFile)}, Msg: err.Error()}
		}
		for i, n := range notes {
			cp, err := c2sp.ParseCheckpoint(n)
			if err != nil {
				return nil, &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Epoch: e, File: filepath.Join(dir, logdir.EpochName(e), WitnessFile), Line: int64(i + 1)}, Msg: fmt.Sprintf("cosigned log checkpoint: %v", err)}
			}
			lc.cosigned = append(lc.cosigned, cosignedAt{epoch: e, line: i + 1, raw: n, cp: cp})
			lc.want[cp.Size] = nil
		}
	}
	return lc, nil
}

func (lc *logCheck) leaf(h tlog.Hash) {
	lc.fr.Append(h)
	if p, ok := lc.want[lc.fr.N]; ok && p == nil {
		r := lc.fr.Root()
		lc.want[lc.fr.N] = &r
	}
}

// genesis checks an epoch's log member against the log tree before it.
func (lc *logCheck) genesis(res *EpochResult, base merkle.Frontier) error {
	lc.bases[res.Epoch] = base.N
	g := res.Genesis
	pos := record.Position{Epoch: res.Epoch, File: filepath.Join(res.Dir, logdir.SegmentName(1)), Line: 1, Index: 0, Kind: record.KindGenesis}
	if g == nil || g.Log == nil {
		return nil
	}
	l := g.Log
	v, err := note.NewVerifier(l.Key)
	if err != nil {
		return &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Msg: fmt.Sprintf("genesis log key %q: %v", clip(l.Key), err)}
	}
	if v.Name() != l.Origin {
		return &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Expected: l.Origin, Computed: v.Name(), Msg: "genesis log key name differs from the log origin"}
	}
	if lc.id != nil && (lc.id.Origin != l.Origin || lc.id.Key != l.Key) {
		return &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Expected: lc.id.Origin + " " + lc.id.Key, Computed: l.Origin + " " + l.Key,
			Msg:  fmt.Sprintf("epoch %d names another log identity than epoch %d: a log keeps one origin and one log key", res.Epoch, lc.idEpoch),
			Hint: "a new log identity is a new log: start it in a new audit directory"}
	}
	if l.Size != base.N {
		return &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Expected: fmt.Sprint(l.Size), Computed: fmt.Sprint(base.N),
			Msg: fmt.Sprintf("epoch %d's genesis says the earlier epochs hold %d records, they hold %d", res.Epoch, l.Size, base.N)}
	}
	f, err := merkle.FrontierFrom(l.Size, l.Frontier)
	if err != nil || !slices.Equal(f.Hashes, base.Hashes) {
		return &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Msg: fmt.Sprintf("epoch %d's genesis log frontier does not match the earlier epochs' records", res.Epoch)}
	}
	lc.id, lc.idEpoch, lc.lastWithL = l, res.Epoch, res.Epoch
	return nil
}

// finish checks the cosigned log checkpoints and the witness quorum.
func (lc *logCheck) finish(rep *Report) error {
	if lc.id == nil {
		if len(lc.cosigned) > 0 {
			c := lc.cosigned[0]
			return &record.VerifyError{Class: record.ClassIntegrity, Pos: record.Position{Epoch: c.epoch, File: WitnessFile, Line: int64(c.line)},
				Msg: "the log holds cosigned log checkpoints but no epoch names a log identity (genesis member log)"}
		}
		if len(lc.wits) > 0 {
			return &record.VerifyError{Class: record.ClassTruncation, Msg: "--witness: the log has no log identity (no genesis names a log origin and key), so no witness can have cosigned it",
				Hint: "configure the gateway's log identity and witnesses (audit.log, audit.witnesses), or verify without --witness"}
		}
		return nil
	}
	lr := &LogReport{Origin: lc.id.Origin, Key: lc.id.Key, Size: lc.fr.N}
	rep.Log = lr
	lv, _ := note.NewVerifier(lc.id.Key)
	vs := note.VerifierList(append([]note.Verifier{lv}, lc.wits...)...)
	bySize := map[int64]*cosigs{}
	for _, c := range lc.cosigned {
		if err := lc.cosignedCheckpoint(rep, c, vs, lv, bySize); err != nil {
			return err
		}
		lr.Cosigned++
	}
	if len(lc.wits) == 0 {
		return nil
	}
	wc, err := lc.witnessed(rep, lv, bySize)
	if err != nil {
		return err
	}
	lr.Witnessed = wc
	return nil
}

// cosigs are the cosignatures of the log checkpoints of one size.
type cosigs struct {
	names map[string]int64 // witness -> newest cosignature time
	raw   []byte
	cp    *c2sp.Checkpoint
	lines []string
}

// cosignedCheckpoint checks one cosigned log checkpoint (witness.jsonl)
// against the log key and the log tree, and adds its cosignatures to
// bySize.
func (lc *logCheck) cosignedCheckpoint(rep *Report, c cosignedAt, vs note.Verifiers, lv note.Verifier, bySize map[int64]*cosigs) error {
	pos := record.Position{Epoch: c.epoch, File: filepath.Join(rep.Dir, logdir.EpochName(c.epoch), WitnessFile), Line: int64(c.line)}
	n, err := note.Open(c.raw, vs)
	if err != nil {
		var bad *note.InvalidSignatureError
		var uv *note.UnverifiedNoteError
		switch {
		case errors.As(err, &bad):
			return &record.VerifyError{Class: record.ClassSignature, Pos: pos, Msg: fmt.Sprintf("log checkpoint of size %d: the signature of %s does not verify: a forged or altered cosignature", c.cp.Size, bad.Name)}
		case errors.As(err, &uv):
			return &record.VerifyError{Class: record.ClassKey, Pos: pos, Msg: fmt.Sprintf("log checkpoint of size %d is not signed by the log key %s (signed by %s)", c.cp.Size, lc.id.Origin, scan.SigNames(uv.Note))}
		}
		return &record.VerifyError{Class: record.ClassSignature, Pos: pos, Msg: fmt.Sprintf("log checkpoint of size %d: %v", c.cp.Size, err)}
	}
	haveLog := false
	for _, s := range n.Sigs {
		if s.Name == lv.Name() && s.Hash == lv.KeyHash() {
			haveLog = true
		}
	}
	if !haveLog {
		return &record.VerifyError{Class: record.ClassKey, Pos: pos, Msg: fmt.Sprintf("log checkpoint of size %d carries cosignatures but not the log key's signature", c.cp.Size)}
	}
	if c.cp.Origin != lc.id.Origin {
		return &record.VerifyError{Class: record.ClassIntegrity, Pos: pos, Expected: lc.id.Origin, Computed: c.cp.Origin, Msg: "cosigned log checkpoint of another origin"}
	}
	if c.cp.Size > lc.fr.N {
		return &record.VerifyError{Class: record.ClassTruncation, Pos: pos, Expected: fmt.Sprint(c.cp.Size), Computed: fmt.Sprint(lc.fr.N),
			Msg:  fmt.Sprintf("a log checkpoint signed by the log key (and cosigned by %s) commits to %d records, but the log holds %d: %d records were cut from its tail (truncation or rollback)", witnessNames(n, lv), c.cp.Size, lc.fr.N, c.cp.Size-lc.fr.N),
			Hint: "restore the log from a backup; the cosigned checkpoint proves the missing records existed"}
	}
	root := (&merkle.Frontier{}).Root()
	if r := lc.want[c.cp.Size]; r != nil {
		root = *r
	}
	if root != c.cp.Root {
		return &record.VerifyError{Class: record.ClassFork, Pos: pos, Expected: scan.B64(c.cp.Root), Computed: scan.B64(root),
			Msg:  fmt.Sprintf("SECURITY ERROR: fork: the first %d records of the log hash to another root than the log checkpoint cosigned by %s: this log is not the one the witnesses saw", c.cp.Size, witnessNames(n, lv)),
			Hint: "the history was rewritten by someone holding the keys; keep this directory and the witnesses' state as evidence"}
	}
	s := bySize[c.cp.Size]
	if s == nil {
		s = &cosigs{names: map[string]int64{}, cp: c.cp}
		bySize[c.cp.Size] = s
	}
	if s.raw == nil {
		s.raw = c.raw
	}
	for _, sg := range n.Sigs {
		if sg.Name == lv.Name() && sg.Hash == lv.KeyHash() {
			continue
		}
		t, err := c2sp.CosignatureTime(sg)
		if err != nil {
			return &record.VerifyError{Class: record.ClassSignature, Pos: pos, Msg: fmt.Sprintf("cosignature of %s: %v", sg.Name, err)}
		}
		id := fmt.Sprintf("%s+%08x", sg.Name, sg.Hash)
		if t > s.names[id] {
			if _, had := s.names[id]; !had {
				s.lines = append(s.lines, "— "+sg.Name+" "+sg.Base64+"\n")
			}
			s.names[id] = t
		}
	}
	return nil
}

// witnessed checks that the newest checkpoint of the log carries the
// quorum of the given witnesses' cosignatures, recent enough.
func (lc *logCheck) witnessed(rep *Report, lv note.Verifier, bySize map[int64]*cosigs) (*WitnessedCheckpoint, error) {
	// The newest checkpoint record of the log, as a log checkpoint.
	var last *EpochResult
	for _, r := range rep.Epochs {
		if r.LastCheckpoint != nil {
			last = r
		}
	}
	if last == nil {
		return nil, &record.VerifyError{Class: record.ClassUnsigned, Msg: "--witness: the log holds no checkpoint to be witnessed"}
	}
	if last.Epoch < lc.lastWithL || last.Genesis == nil || last.Genesis.Log == nil {
		return nil, &record.VerifyError{Class: record.ClassTruncation, Pos: record.Position{Epoch: last.Epoch},
			Msg: fmt.Sprintf("--witness: epoch %d holds the newest checkpoint but names no log identity, so no witness cosigned it", last.Epoch)}
	}
	size := lc.bases[last.Epoch] + last.LastCheckpointAt + 1
	wc := &WitnessedCheckpoint{Size: size, Epoch: last.Epoch, Index: last.LastCheckpointAt, Quorum: lc.opt.WitnessQuorum, Witnesses: []string{}}
	if r := lc.want[size]; r != nil {
		wc.Root = scan.B64(*r)
	}
	var times []int64
	if s := bySize[size]; s != nil {
		for _, v := range lc.wits {
			id := fmt.Sprintf("%s+%08x", v.Name(), v.KeyHash())
			if t, ok := s.names[id]; ok {
				wc.Witnesses = append(wc.Witnesses, v.Name())
				times = append(times, t)
			}
		}
		// The checkpoint, the log key's signature, every verified cosignature.
		text, sigLines, _ := strings.Cut(string(s.raw), "\n\n")
		for _, l := range strings.SplitAfter(sigLines, "\n") {
			if strings.HasPrefix(l, "— "+lv.Name()+" ") {
				wc.Note = text + "\n\n" + l + strings.Join(s.lines, "")
			}
		}
	}
	if len(wc.Witnesses) < lc.opt.WitnessQuorum {
		names := "none"
		if len(wc.Witnesses) > 0 {
			names = strings.Join(wc.Witnesses, ", ")
		}
		return nil, &record.VerifyError{Class: record.ClassTruncation, Pos: record.Position{Epoch: last.Epoch, Index: last.LastCheckpointAt, Kind: record.KindCheckpoint},
			Expected: fmt.Sprint(lc.opt.WitnessQuorum), Computed: fmt.Sprint(len(wc.Witnesses)),
			Msg: fmt.Sprintf("the newest checkpoint (epoch %d record %d, log size %d) carries %d of the %d cosignatures required from the given witnesses (cosigned by: %s): the log was cut back or rolled back to a point the witnesses have moved past, forked, or its newest checkpoint was not yet witnessed",
				last.Epoch, last.LastCheckpointAt, size, len(wc.Witnesses), lc.opt.WitnessQuorum, names),
			Hint: "if the gateway is running and a witness was briefly down, verify again in a few seconds; otherwise the witnesses saw another log"}
	}
	slices.Sort(times)
	slices.Reverse(times)
	wc.Time = time.Unix(times[lc.opt.WitnessQuorum-1], 0).UTC()
	if lc.opt.WitnessMaxAge > 0 {
		now := time.Now()
		if lc.opt.Now != nil {
			now = lc.opt.Now()
		}
		if age := now.Sub(wc.Time); age > lc.opt.WitnessMaxAge {
			return nil, &record.VerifyError{Class: record.ClassTruncation, Pos: record.Position{Epoch: last.Epoch, Index: last.LastCheckpointAt, Kind: record.KindCheckpoint},
				Msg: fmt.Sprintf("the newest checkpoint was cosigned by a quorum at %s, %s ago, more than --witness-max-age %s: a log cut back to an earlier witnessed point looks like this (a running gateway has its newest checkpoint cosigned again while idle)",
					wc.Time.Format(time.RFC3339), age.Round(time.Second), lc.opt.WitnessMaxAge)}
		}
	}
	return wc, nil
}

func witnessNames(n *note.Note, logKey note.Verifier) string {
	var out []string
	for _, s := range n.Sigs {
		if s.Name == logKey.Name() && s.Hash == logKey.KeyHash() {
			continue
		}
		out = append(out, s.Name)
	}
	if len(out) == 0 {
		return "no known witness"
	}
	return strings.Join(out, ", ")
}
