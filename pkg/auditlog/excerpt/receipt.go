package excerpt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	jsonv2 "github.com/go-json-experiment/json"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// ReceiptFormat is the format member of a session receipt.
const ReceiptFormat = "cmcp-receipt/v1"

// SessionReceipt is what the gateway recorded for one session, verifiable
// without the rest of the log (FORMAT.md section 12): the session's
// records and the epoch's genesis (its key, statement and attestation
// evidence), each with an inclusion proof against a checkpoint signed by
// the epoch's key, and, with a log identity, that checkpoint's record with
// an inclusion proof against a log checkpoint its witnesses cosigned.
// Payloads stay sealed: records hold commitments, never payloads.
type SessionReceipt struct {
	Format     string          `json:"format"`
	Session    string          `json:"session"`
	Epoch      int             `json:"epoch"`
	Created    time.Time       `json:"created"`
	Checkpoint string          `json:"checkpoint"` // epoch checkpoint note, size N
	Genesis    ReceiptRecord   `json:"genesis"`
	Records    []ReceiptRecord `json:"records"`
	Log        *ReceiptLog     `json:"log,omitempty"`
}

// ReceiptRecord is one record line and its inclusion proof.
type ReceiptRecord struct {
	Index int64    `json:"index"`
	Line  string   `json:"line"`
	Proof []string `json:"proof"` // base64 hashes, RFC 6962 inclusion proof
}

// ReceiptLog ties the epoch checkpoint to the witnessed log tree: Record is
// the checkpoint record (index N of the epoch, log entry log.size + N) and
// its inclusion proof against Checkpoint, a log checkpoint with the log
// key's signature and the witnesses' cosignatures.
type ReceiptLog struct {
	Checkpoint string        `json:"checkpoint"`
	Record     ReceiptRecord `json:"record"`
}

// sessionOf returns the session a gateway record belongs to ("" if none).
func sessionOf(k record.Kind, body []byte) string {
	var m struct {
		ID      string `json:"id"`
		Session string `json:"session"`
	}
	if jsonv2.Unmarshal(body, &m) != nil {
		return ""
	}
	if k == record.KindSession {
		return m.ID
	}
	if record.IsWriterKind(k) {
		return ""
	}
	return m.Session
}

// MakeReceipt builds the receipt of a session from the audit directory: the
// newest epoch that holds the session's records is verified, and its newest
// checkpoint must cover them (the gateway forces one first). With a log
// identity, the receipt rests on the newest checkpoint that covers them and
// that a cosigned log checkpoint covers, if there is one. opt is as for
// Verify (Keys, VerifyEvidence).
func MakeReceipt(dir, session string, opt auditlog.VerifyOptions) (*SessionReceipt, error) {
	if session == "" {
		return nil, &record.VerifyError{Class: record.ClassUsage, Msg: "receipt: no session id given"}
	}
	epochs, err := logdir.ListEpochs(dir)
	if err != nil {
		return nil, record.IOFailure(record.Position{}, err)
	}
	for i := len(epochs) - 1; i >= 0; i-- {
		rs, err := MakeReceipts(dir, epochs[i], []string{session}, opt)
		if err != nil {
			var ve *record.VerifyError
			if errors.As(err, &ve) && ve.Class == record.ClassNotLog && i == len(epochs)-1 && i > 0 {
				continue // an aborted start
			}
			return nil, err
		}
		if r := rs[session]; r != nil {
			return r, nil
		}
	}
	return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("receipt: no record of session %q in %s", session, dir)}
}

// receiptHit is a record of a session a receipt is made for.
type receiptHit struct {
	idx  int64
	line []byte
}

// receiptScan is what one reading of an epoch gives MakeReceipts: the
// epoch's result, its genesis line, its checkpoint records and the
// records of the sessions asked for.
type receiptScan struct {
	res         *scan.EpochResult
	genesisLine []byte
	cpLines     map[int64][]byte
	cps         []*c2sp.Checkpoint
	hits        map[string][]receiptHit
}

// scanForReceipts verifies the epoch (opt as for Verify) and keeps what
// the receipts of sessions need.
func scanForReceipts(dir string, epoch int, sessions []string, opt auditlog.VerifyOptions) (*receiptScan, error) {
	var trusted map[string]bool
	if len(opt.Keys) > 0 {
		var err error
		if trusted, err = auditlog.ParseKeys(opt.Keys); err != nil {
			return nil, err
		}
	}
	want := map[string]bool{}
	for _, s := range sessions {
		want[s] = true
	}
	rs := &receiptScan{cpLines: map[int64][]byte{}, hits: map[string][]receiptHit{}}
	var d scan.Detail
	res, err := scan.Epoch(dir, epoch, scan.Options{Detail: &d, Trusted: trusted, KeepLeaves: true, Evidence: opt.VerifyEvidence, OnCheckpoint: func(c *c2sp.Checkpoint) { rs.cps = append(rs.cps, c) }, OnRecord: func(en *auditlog.Entry) error {
		switch {
		case en.Index == 0:
			rs.genesisLine = slices.Clone(en.Line)
		case en.Kind == record.KindCheckpoint:
			rs.cpLines[en.Index] = slices.Clone(en.Line)
		default:
			if s := sessionOf(en.Kind, en.Body); s != "" && want[s] {
				rs.hits[s] = append(rs.hits[s], receiptHit{en.Index, slices.Clone(en.Line)})
			}
		}
		return nil
	}})
	if err != nil {
		if d.Empty {
			return nil, &record.VerifyError{Class: record.ClassNotLog, Pos: record.Position{Epoch: epoch}, Msg: fmt.Sprintf("epoch %d holds no record", epoch)}
		}
		return nil, err
	}
	rs.res = res
	return rs, nil
}

// MakeReceipts builds the receipts of several sessions of one epoch with
// one reading of it (the gateway batches the sessions that ended). A
// session without a record in the epoch has no receipt in the map.
func MakeReceipts(dir string, epoch int, sessions []string, opt auditlog.VerifyOptions) (map[string]*SessionReceipt, error) {
	rs, err := scanForReceipts(dir, epoch, sessions, opt)
	if err != nil {
		return nil, err
	}
	res, hits, cps, cpLines, genesisLine := rs.res, rs.hits, rs.cps, rs.cpLines, rs.genesisLine
	out := map[string]*SessionReceipt{}
	if len(hits) == 0 {
		return out, nil
	}
	cp := res.LastCheckpoint
	for s, hs := range hits {
		if last := hs[len(hs)-1].idx; cp == nil || last >= cp.Size {
			return nil, &record.VerifyError{Class: record.ClassUsage, Pos: record.Position{Epoch: epoch, Index: last},
				Msg:  fmt.Sprintf("session %s has records after epoch %d's newest checkpoint: no signature covers them yet", s, epoch),
				Hint: "ask the gateway for the receipt (it signs a checkpoint first), or wait for its next checkpoint (by default within a second)"}
		}
	}
	var lg *ReceiptLog
	if g := res.Genesis; g.Log != nil {
		// The newest checkpoint that covers every session's records and
		// that a cosigned log checkpoint covers, else the newest: one
		// signed after the checkpoint the gateway forced for this receipt
		// (another session's receipt, the interval timer) is not cosigned
		// yet and must not hide the one that is.
		var last int64
		for _, hs := range hits {
			last = max(last, hs[len(hs)-1].idx)
		}
		cosigned, err := cosignedSize(dir, epoch)
		if err != nil {
			return nil, err
		}
		for i := len(cps) - 1; i >= 0 && cps[i].Size > last; i-- {
			if g.Log.Size+cps[i].Size < cosigned {
				cp = cps[i]
				break
			}
		}
		if lg, err = receiptLog(dir, epoch, g.Log, cp.Size, cpLines[cp.Size]); err != nil {
			return nil, err
		}
	}
	st, err := storeOf(res.Leaves[:cp.Size])
	if err != nil {
		return nil, err
	}
	prove := func(idx int64, line []byte) (ReceiptRecord, error) {
		p, err := tlog.ProveRecord(cp.Size, idx, st)
		if err != nil {
			return ReceiptRecord{}, fmt.Errorf("receipt: inclusion proof of record %d: %w", idx, err)
		}
		rr := ReceiptRecord{Index: idx, Line: string(line), Proof: []string{}}
		for _, h := range p {
			rr.Proof = append(rr.Proof, h.String())
		}
		return rr, nil
	}
	gen, err := prove(0, genesisLine)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	for s, hs := range hits {
		r := &SessionReceipt{Format: ReceiptFormat, Session: s, Epoch: epoch, Created: now, Checkpoint: string(cp.Note), Genesis: gen, Records: []ReceiptRecord{}, Log: lg}
		for _, h := range hs {
			rr, err := prove(h.idx, h.line)
			if err != nil {
				return nil, err
			}
			r.Records = append(r.Records, rr)
		}
		out[s] = r
	}
	return out, nil
}

// cosignedSize returns the size of the largest cosigned log checkpoint
// kept in the epoch's directory (0 if none).
func cosignedSize(dir string, epoch int) (int64, error) {
	notes, err := logdir.ReadCosigned(fmt.Sprintf("%s/%s", dir, logdir.EpochName(epoch)))
	if err != nil {
		return 0, err
	}
	var n int64
	for _, raw := range notes {
		if cp, err := c2sp.ParseCheckpoint(raw); err == nil {
			n = max(n, cp.Size)
		}
	}
	return n, nil
}

// receiptLog proves the epoch checkpoint record at index n in the log tree
// against the smallest cosigned log checkpoint that covers it.
func receiptLog(dir string, epoch int, li *record.LogInfo, n int64, cpLine []byte) (*ReceiptLog, error) {
	notes, err := logdir.ReadCosigned(fmt.Sprintf("%s/%s", dir, logdir.EpochName(epoch)))
	if err != nil {
		return nil, err
	}
	at := li.Size + n
	var best []byte
	var bestSize int64
	for _, raw := range notes {
		cp, err := c2sp.ParseCheckpoint(raw)
		if err != nil || cp.Size <= at {
			continue
		}
		if best == nil || cp.Size < bestSize {
			best, bestSize = raw, cp.Size
		}
	}
	if best == nil {
		return nil, nil // not witnessed (yet): the receipt rests on the epoch key alone
	}
	// Every cosignature of that size, merged into one note.
	text, _, _ := bytes.Cut(best, []byte("\n\n"))
	var sigs []string
	for _, raw := range notes {
		t, s, _ := bytes.Cut(raw, []byte("\n\n"))
		if !bytes.Equal(t, text) {
			continue
		}
		for _, l := range strings.SplitAfter(string(s), "\n") {
			if l != "" && !slices.Contains(sigs, l) {
				sigs = append(sigs, l)
			}
		}
	}
	merged := string(text) + "\n\n" + strings.Join(sigs, "")
	leaves, err := auditlog.ReadLogLeaves(dir, bestSize)
	if err != nil {
		return nil, err
	}
	st, err := storeOf(leaves)
	if err != nil {
		return nil, err
	}
	p, err := tlog.ProveRecord(bestSize, at, st)
	if err != nil {
		return nil, fmt.Errorf("receipt: log inclusion proof: %w", err)
	}
	rr := ReceiptRecord{Index: n, Line: string(cpLine), Proof: []string{}}
	for _, h := range p {
		rr.Proof = append(rr.Proof, h.String())
	}
	return &ReceiptLog{Checkpoint: merged, Record: rr}, nil
}

// Encode returns the receipt as JSON (one document, indented).
func (r *SessionReceipt) Encode() ([]byte, error) {
	b, err := jsonv2.Marshal(r, jsonv2.Deterministic(true))
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// ReceiptOptions control VerifyReceipt.
type ReceiptOptions struct {
	Keys           []string // trusted epoch keys (as Verify)
	VerifyEvidence func(g *record.Genesis) error
	Witnesses      []string // as Verify: the receipt's log checkpoint must carry WitnessQuorum of them
	WitnessQuorum  int
}

// ReceiptResult is what VerifyReceipt established.
type ReceiptResult struct {
	Session     string                        `json:"session"`
	Epoch       int                           `json:"epoch"`
	Origin      string                        `json:"origin"`
	Records     int                           `json:"records"`
	Kinds       map[record.Kind]int           `json:"kinds"`
	Checkpoint  *c2sp.Checkpoint              `json:"-"`
	KeysTrusted bool                          `json:"keys_trusted"`
	Attested    bool                          `json:"attested"` // the genesis evidence was checked
	Log         *auditlog.WitnessedCheckpoint `json:"witnessed,omitempty"`
	LogOrigin   string                        `json:"log_origin,omitempty"`
	Warnings    []string                      `json:"warnings"`
}

// VerifyReceipt checks a session receipt offline: every record line is
// canonical, belongs to the session and is included in the epoch
// checkpoint, which the genesis key signs; the genesis key is trusted
// (Keys) or its evidence verified (VerifyEvidence); with a log checkpoint,
// the epoch checkpoint's record is included in it, the log key of the
// genesis signs it and the given witnesses' cosignatures verify.
func VerifyReceipt(b []byte, opt ReceiptOptions) (*ReceiptResult, error) {
	var r SessionReceipt
	if err := jsonv2.Unmarshal(b, &r, jsonv2.RejectUnknownMembers(true)); err != nil {
		return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("receipt: not a session receipt: %v", err)}
	}
	if r.Format != ReceiptFormat {
		return nil, &record.VerifyError{Class: record.ClassUsage, Msg: fmt.Sprintf("receipt: format %q, want %q", r.Format, ReceiptFormat)}
	}
	res := &ReceiptResult{Session: r.Session, Epoch: r.Epoch, Kinds: map[record.Kind]int{}, Warnings: []string{}}
	g, err := receiptGenesis(&r, opt, res)
	if err != nil {
		return nil, err
	}
	cp, err := receiptCheckpoint(&r, g)
	if err != nil {
		return nil, err
	}
	res.Checkpoint = cp
	if err := receiptRecords(&r, cp, res); err != nil {
		return nil, err
	}
	// The witnessed log.
	if r.Log == nil {
		if len(opt.Witnesses) > 0 {
			return nil, receiptErr(record.ClassTruncation, "--witness: the receipt holds no cosigned log checkpoint")
		}
		return res, nil
	}
	if err := checkReceiptLog(&r, opt, g, cp, res); err != nil {
		return nil, err
	}
	return res, nil
}

func receiptErr(c record.Class, format string, a ...any) error {
	return &record.VerifyError{Class: c, Msg: "receipt: " + fmt.Sprintf(format, a...)}
}

// receiptGenesis checks the receipt's genesis (canonical, its statement,
// its epoch) and, per opt, that its key is trusted and its evidence holds.
func receiptGenesis(r *SessionReceipt, opt ReceiptOptions, res *ReceiptResult) (*record.Genesis, error) {
	// The genesis: key, statement, evidence.
	ge, err := record.ParseLine([]byte(r.Genesis.Line))
	if err != nil || ge.Kind != record.KindGenesis || ge.Seq != 0 || r.Genesis.Index != 0 {
		return nil, receiptErr(record.ClassIntegrity, "the genesis line is not a canonical genesis record at index 0 (%v)", err)
	}
	gr, err := record.DecodeBody(record.KindGenesis, ge.Body)
	if err != nil {
		return nil, receiptErr(record.ClassIntegrity, "genesis: %v", err)
	}
	g := gr.(*record.Genesis)
	if st, err := auditlog.StatementOf(ge.Body); err != nil || st != g.Statement {
		return nil, receiptErr(record.ClassIntegrity, "the genesis statement does not match its body")
	}
	if g.Epoch != r.Epoch {
		return nil, receiptErr(record.ClassIntegrity, "the genesis is epoch %d's, the receipt says epoch %d", g.Epoch, r.Epoch)
	}
	res.Origin = g.Origin
	if len(opt.Keys) > 0 {
		set, err := auditlog.ParseKeys(opt.Keys)
		if err != nil {
			return nil, err
		}
		if !set[g.Key] {
			return nil, receiptErr(record.ClassKey, "epoch %d's key %s is not a trusted key (--key)", g.Epoch, clip(g.Key))
		}
		res.KeysTrusted = true
	}
	if opt.VerifyEvidence != nil {
		if err := opt.VerifyEvidence(g); err != nil {
			return nil, &record.VerifyError{Class: record.ClassKey, Msg: fmt.Sprintf("receipt: genesis evidence: %v", err), Err: err}
		}
		res.Attested = true
	}
	if !res.KeysTrusted {
		res.Warnings = append(res.Warnings, "no --key given: the epoch's key is trusted only as far as its genesis evidence binds it (see the evidence verdict); without either, anyone could have made this receipt")
	}
	return g, nil
}

// receiptCheckpoint opens the receipt's checkpoint with the epoch's key.
func receiptCheckpoint(r *SessionReceipt, g *record.Genesis) (*c2sp.Checkpoint, error) {
	ev, err := note.NewVerifier(g.Key)
	if err != nil {
		return nil, receiptErr(record.ClassIntegrity, "genesis key: %v", err)
	}
	cp, err := c2sp.OpenCheckpoint([]byte(r.Checkpoint), note.VerifierList(ev))
	if err != nil {
		var uv *note.UnverifiedNoteError
		if errors.As(err, &uv) {
			return nil, receiptErr(record.ClassKey, "the checkpoint is not signed by the epoch's key")
		}
		return nil, receiptErr(record.ClassSignature, "the checkpoint: %v", err)
	}
	if cp.Origin != g.Origin {
		return nil, receiptErr(record.ClassIntegrity, "the checkpoint's origin %s is not the epoch's %s", cp.Origin, g.Origin)
	}
	return cp, nil
}

// receiptLine parses a record of the receipt and checks its index
// against the tree of size size.
func receiptLine(rr ReceiptRecord, size int64) (record.Envelope, error) {
	e, err := record.ParseLine([]byte(rr.Line))
	if err != nil {
		return e, receiptErr(record.ClassIntegrity, "record %d is not canonical: %v", rr.Index, err)
	}
	if e.Seq != rr.Index {
		return e, receiptErr(record.ClassIntegrity, "record %d has seq %d", rr.Index, e.Seq)
	}
	if rr.Index >= size {
		return e, receiptErr(record.ClassIntegrity, "record %d is not covered by a checkpoint of size %d", rr.Index, size)
	}
	return e, nil
}

// receiptIncl checks rr's inclusion proof at index at in the tree of size
// size and root root.
func receiptIncl(rr ReceiptRecord, at, size int64, root tlog.Hash) error {
	var p tlog.RecordProof
	for _, s := range rr.Proof {
		h, err := tlog.ParseHash(s)
		if err != nil {
			return receiptErr(record.ClassIntegrity, "record %d: proof hash %q: %v", rr.Index, clip(s), err)
		}
		p = append(p, h)
	}
	if err := tlog.CheckRecord(p, size, root, at, tlog.RecordHash([]byte(rr.Line))); err != nil {
		return receiptErr(record.ClassIntegrity, "record %d is not in the tree the checkpoint signs (size %d): %v", rr.Index, size, err)
	}
	return nil
}

// receiptRecords checks the genesis and the session's records against the
// checkpoint: canonical, in log order, the session's, in its tree.
func receiptRecords(r *SessionReceipt, cp *c2sp.Checkpoint, res *ReceiptResult) error {
	if _, err := receiptLine(r.Genesis, cp.Size); err != nil {
		return err
	}
	if err := receiptIncl(r.Genesis, 0, cp.Size, cp.Root); err != nil {
		return err
	}
	prev := int64(0)
	for _, rr := range r.Records {
		e, err := receiptLine(rr, cp.Size)
		if err != nil {
			return err
		}
		if rr.Index <= prev {
			return receiptErr(record.ClassIntegrity, "records are not in log order (record %d after %d)", rr.Index, prev)
		}
		prev = rr.Index
		if s := sessionOf(e.Kind, e.Body); s != r.Session {
			return receiptErr(record.ClassIntegrity, "record %d (%s) belongs to session %q, not %q", rr.Index, e.Kind, s, r.Session)
		}
		if err := receiptIncl(rr, rr.Index, cp.Size, cp.Root); err != nil {
			return err
		}
		res.Kinds[e.Kind]++
	}
	res.Records = len(r.Records)
	if len(r.Records) == 0 {
		return receiptErr(record.ClassIntegrity, "it holds no record of the session")
	}
	return nil
}

// checkReceiptLog checks the log checkpoint the witnesses cosigned and the
// epoch checkpoint's record in the log tree, and the witness quorum.
func checkReceiptLog(r *SessionReceipt, opt ReceiptOptions, g *record.Genesis, cp *c2sp.Checkpoint, res *ReceiptResult) error {
	if g.Log == nil {
		return receiptErr(record.ClassIntegrity, "it holds a log checkpoint, but the genesis names no log identity")
	}
	res.LogOrigin = g.Log.Origin
	lv, err := note.NewVerifier(g.Log.Key)
	if err != nil {
		return receiptErr(record.ClassIntegrity, "genesis log key: %v", err)
	}
	list := []note.Verifier{lv}
	for _, k := range opt.Witnesses {
		v, err := c2sp.NewCosignatureVerifier(k)
		if err != nil {
			return &record.VerifyError{Class: record.ClassUsage, Msg: "--witness: " + err.Error()}
		}
		list = append(list, v)
	}
	n, err := note.Open([]byte(r.Log.Checkpoint), note.VerifierList(list...))
	if err != nil {
		var bs *note.InvalidSignatureError
		if errors.As(err, &bs) {
			return receiptErr(record.ClassSignature, "the log checkpoint: the signature of %s does not verify", bs.Name)
		}
		return receiptErr(record.ClassKey, "the log checkpoint is not signed by the log key: %v", err)
	}
	lcp, err := c2sp.ParseCheckpointBody(n.Text)
	if err != nil || lcp.Origin != g.Log.Origin {
		return receiptErr(record.ClassIntegrity, "the log checkpoint is not one of %s", g.Log.Origin)
	}
	wc := &auditlog.WitnessedCheckpoint{Size: lcp.Size, Root: scan.B64(lcp.Root), Epoch: r.Epoch, Index: cp.Size, Quorum: opt.WitnessQuorum, Witnesses: []string{}, Note: r.Log.Checkpoint}
	var newest int64
	for _, s := range n.Sigs {
		if s.Name == lv.Name() && s.Hash == lv.KeyHash() {
			continue
		}
		wc.Witnesses = append(wc.Witnesses, s.Name)
		if t, err := c2sp.CosignatureTime(s); err == nil && (newest == 0 || t < newest) {
			newest = t
		}
	}
	if newest > 0 {
		wc.Time = time.Unix(newest, 0).UTC()
	}
	// The epoch checkpoint's own record, in the log tree.
	if r.Log.Record.Index != cp.Size {
		return receiptErr(record.ClassIntegrity, "the log proof is for record %d, the checkpoint is record %d", r.Log.Record.Index, cp.Size)
	}
	ce, err := record.ParseLine([]byte(r.Log.Record.Line))
	if err != nil || ce.Kind != record.KindCheckpoint || ce.Seq != cp.Size {
		return receiptErr(record.ClassIntegrity, "the log proof's record is not the checkpoint record %d", cp.Size)
	}
	cr, err := record.DecodeBody(record.KindCheckpoint, ce.Body)
	if err != nil || cr.(*record.CheckpointRecord).Note != r.Checkpoint {
		return receiptErr(record.ClassIntegrity, "the log proof's checkpoint record does not hold the receipt's checkpoint")
	}
	if err := receiptIncl(r.Log.Record, g.Log.Size+cp.Size, lcp.Size, lcp.Root); err != nil {
		return err
	}
	if q := opt.WitnessQuorum; len(opt.Witnesses) > 0 {
		if q == 0 {
			q = len(opt.Witnesses)
		}
		if len(wc.Witnesses) < q {
			return receiptErr(record.ClassTruncation, "the log checkpoint carries %d of the %d cosignatures required (cosigned by: %s)", len(wc.Witnesses), q, strings.Join(wc.Witnesses, ", "))
		}
		wc.Quorum = q
		res.Log = wc
	} else if len(wc.Witnesses) > 0 {
		res.Warnings = append(res.Warnings, fmt.Sprintf("the log checkpoint carries cosignatures of %s, not checked: pass their keys with --witness", strings.Join(wc.Witnesses, ", ")))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}
