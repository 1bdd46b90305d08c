package cli

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/attestedlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/excerpt"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

type verifyChainOptions struct {
	Keys           []string
	Checkpoints    []string
	SaveCheckpoint string
	Prove          int64 // -1: not asked
	prove          string
	Epoch          int
	Proof          string
	Segment        string
	RequireSigned  bool
	Strict         bool
	Evidence       chainEvidenceOptions
	Witnesses      []string
	WitnessQuorum  int
	WitnessMaxAge  time.Duration
	Receipt        string
	MakeReceipt    string
}

func (o *verifyChainOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.Keys, "key", nil, "trusted note verifier key (origin+hash+base64), or a file with one per line; repeatable")
	fs.StringArrayVar(&o.Checkpoints, "checkpoint", nil, "signed checkpoint FILE saved earlier (detects truncation, rollback and forks); repeatable")
	fs.StringVar(&o.SaveCheckpoint, "save-checkpoint", "", "write the newest verified checkpoint to FILE (a checkpoint already in FILE is checked first, as with --checkpoint)")
	fs.StringVar(&o.prove, "prove", "", "write an offline proof (c2sp.org/tlog-proof@v1) for record `N` to stdout")
	fs.IntVar(&o.Epoch, "epoch", 0, "epoch of the record for --prove (default: the newest)")
	fs.StringVar(&o.Proof, "proof", "", "check the offline proof in FILE (needs --key; no log needed)")
	fs.StringVar(&o.Segment, "segment", "", "verify one segment FILE on its own, from the checkpoint and tree frontier it starts with (needs --key)")
	fs.BoolVar(&o.RequireSigned, "require-signed", false, "fail (exit 11) when an earlier epoch holds records its key never signed: the tail a crashed gateway left, which anyone able to write the disk before the restart could have altered (implied by --require-attested)")
	fs.BoolVar(&o.Strict, "strict", false, "fail (exit 10) when the audit directory holds files or directories that are not part of the log (each is a warning without it)")
	fs.StringArrayVar(&o.Witnesses, "witness", nil, "trusted witness cosignature key (name+hash+base64, type 0x04), or a file with one per line; repeatable: the newest checkpoint must carry their cosignatures (detects truncation and forks without a saved checkpoint)")
	fs.IntVar(&o.WitnessQuorum, "witness-quorum", 0, "how many of the --witness keys must have cosigned the newest checkpoint (default: all)")
	fs.DurationVar(&o.WitnessMaxAge, "witness-max-age", 0, "also require the quorum's cosignatures on the newest checkpoint to be at most this old (catches a log cut back to an earlier witnessed point)")
	fs.StringVar(&o.Receipt, "receipt", "", "verify the session receipt in FILE on its own, without the log (with --key, --witness, the evidence flags)")
	fs.StringVar(&o.MakeReceipt, "make-receipt", "", "write the receipt of session `ID` (its records, their inclusion proofs, the genesis and its evidence, the witnessed log checkpoint) to stdout")
	o.Evidence.AddFlags(fs)
}

func newVerifyChainCmd(e *env) *cobra.Command {
	o := &verifyChainOptions{}
	cmd := &cobra.Command{
		Use:     "verify-chain DIR... | --proof FILE --key KEY | --segment FILE --key KEY | --receipt FILE",
		Short:   "Verify an audit log offline: canonical records, hash links, Merkle tree, signed checkpoints",
		Long:    verifyChainLong,
		Example: verifyChainExample,
		Args:    usageArgs(cobra.ArbitraryArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.parseProve(cmd); err != nil {
				return err
			}
			keys, err := o.loadKeys()
			if err != nil {
				return err
			}
			return o.dispatch(e.printer(), args, keys)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

const verifyChainLong = `verify-chain verifies every epoch and segment of an audit directory: the
canonical form of every line, sequence numbers, hash links, the RFC 6962
tree, every checkpoint signature and root, the epoch chain, and, with
--checkpoint, that the log extends a checkpoint saved earlier (truncation,
rollback and fork detection).

--segment checks one segment file without the rest of its epoch: it starts
from the signed checkpoint and the tree frontier in the file's first record,
and every later checkpoint in the file authenticates them. The result
names the last record the file's last checkpoint signs; a file without a
checkpoint of its own is NOT VERIFIED (exit 11), as the checkpoint it
starts from signs none of its records.

Several directories (one per gateway of a fleet, each with its own keys,
evidence and log) are verified at once with the same --key, --witness and
evidence flags: one verdict table, and the exit code of the first failure.

With --witness (and --witness-quorum N), the newest checkpoint, as a log
checkpoint of the gateway's stable log identity, must carry valid
cosignatures of N of the given witnesses (c2sp.org/tlog-cosignature); every
cosignature of theirs in the log must verify. Witnesses cosign only a log
that extends what they saw before, so truncation and forks of the tail are
then detected with no saved state, and the result says so.

Without a checkpoint kept outside the log or witnesses, truncation of the
tail cannot be detected; verify-chain says so every time, and reports how many records
come after the last checkpoint (the unsealed tail): they are outside the
result ("VERIFIED through record N"). The tail a crashed gateway left in an
earlier epoch was never signed by that epoch's key: it is listed as
UNSIGNED, and --require-signed (implied by --require-attested) fails on it.

A file or directory in the audit directory or an epoch directory that is
not part of the log (a segment copied as seg-000003.jsonl.bak, a name with
seven digits, an epoch directory renamed) is never verified: each is listed
as a warning (in the JSON under "stray" too), and --strict fails on them
(exit 10). What the writer leaves beside the log (.lock, a cut tail kept
as seg-NNNNNN.jsonl.torn-TIME, an aborted-epoch-... directory) is not listed.

On failure it names the epoch, segment file, line, byte offset and record
index, with the expected and computed values, and exits with a code for
the class of failure:
  10 integrity (hash, link, sequence, tree, canonical form)
  11 bad signature, or records no signature covers (--require-signed;
     --segment: a file without a checkpoint)
  12 untrusted key or rejected genesis evidence   13 truncation or rollback
  14 fork   2 usage   3 I/O`

const verifyChainExample = `  cmcp verify-chain /var/lib/cmcp/audit --key "$(cat gateway.vkey)" --save-checkpoint seen.cp
  cmcp verify-chain /var/lib/cmcp/audit --key gateway.vkey --checkpoint seen.cp
  cmcp verify-chain /var/lib/cmcp/audit --key gateway.vkey --witness w1.vkey --witness w2.vkey --witness-quorum 2
  cmcp verify-chain /var/lib/cmcp/audit --prove 4321 > r4321.proof
  cmcp verify-chain --proof r4321.proof --key gateway.vkey
  cmcp verify-chain /var/lib/cmcp/audit --make-receipt 01JB7Q... > session.receipt
  cmcp verify-chain --receipt session.receipt --key gateway.vkey --witness w1.vkey
  cmcp verify-chain --segment /var/lib/cmcp/audit/epoch-000003/seg-000007.jsonl --key gateway.vkey`

// parseProve reads --prove into o.Prove (-1 when not given) and checks
// that --epoch comes with it and names an epoch.
func (o *verifyChainOptions) parseProve(cmd *cobra.Command) error {
	o.Prove = -1
	if o.prove != "" {
		n, err := strconv.ParseInt(o.prove, 10, 64)
		if err != nil || n < 0 {
			return exitcode.Errorf(exitcode.ExitUsage, "--prove %q: want a record index (0, 1, ...)", o.prove)
		}
		o.Prove = n
	}
	if cmd.Flags().Changed("epoch") {
		if o.Prove < 0 {
			return exitcode.Errorf(exitcode.ExitUsage, "--epoch selects the epoch of the record that --prove proves: give --prove N with it")
		}
		if o.Epoch < 1 {
			return exitcode.Errorf(exitcode.ExitUsage, "--epoch %d: epochs are numbered from 1 (without --epoch: the newest)", o.Epoch)
		}
	}
	return nil
}

// dispatch runs the mode the flags and arguments select, after checking
// that no flag of another mode comes with it.
func (o *verifyChainOptions) dispatch(p *ui.Printer, args []string, keys []string) error {
	if o.Segment != "" {
		if len(args) > 0 || o.Proof != "" || o.Prove >= 0 || len(o.Checkpoints) > 0 || o.SaveCheckpoint != "" {
			return exitcode.Errorf(exitcode.ExitUsage, "--segment verifies one file on its own: give no DIR, --proof, --prove, --checkpoint or --save-checkpoint with it")
		}
		return runVerifySegment(p, o.Segment, keys)
	}
	if o.Receipt != "" {
		if len(args) > 0 || o.Proof != "" || o.Prove >= 0 || len(o.Checkpoints) > 0 || o.SaveCheckpoint != "" || o.MakeReceipt != "" {
			return exitcode.Errorf(exitcode.ExitUsage, "--receipt checks a receipt on its own: give no DIR, --proof, --prove, --make-receipt, --checkpoint or --save-checkpoint with it")
		}
		return runVerifyReceipt(p, o, keys)
	}
	if o.Proof != "" {
		if len(args) > 0 || o.Prove >= 0 || len(o.Checkpoints) > 0 || o.SaveCheckpoint != "" {
			return exitcode.Errorf(exitcode.ExitUsage, "--proof checks a proof on its own: give no DIR, --prove, --checkpoint or --save-checkpoint with it")
		}
		return runVerifyProof(p, o.Proof, keys)
	}
	if len(args) > 1 {
		if o.Prove >= 0 || o.MakeReceipt != "" || len(o.Checkpoints) > 0 || o.SaveCheckpoint != "" {
			return exitcode.Errorf(exitcode.ExitUsage, "several audit directories (a fleet) are verified together: give no --prove, --make-receipt, --checkpoint or --save-checkpoint with them")
		}
		return runVerifyFleet(p, args, o, keys)
	}
	if len(args) != 1 {
		return exitcode.Errorf(exitcode.ExitUsage, "give the audit directory to verify (or --proof FILE)")
	}
	if o.Prove >= 0 {
		return runProve(p, args[0], o, keys)
	}
	if o.MakeReceipt != "" {
		return runMakeReceipt(p, args[0], o, keys)
	}
	return runVerifyChain(p, args[0], o, keys)
}

// loadKeys expands --key values that name files.
func (o *verifyChainOptions) loadKeys() ([]string, error) {
	var out []string
	for _, k := range o.Keys {
		if fi, err := os.Stat(k); err == nil && fi.Mode().IsRegular() {
			f, err := os.Open(k)
			if err != nil {
				return nil, exitcode.Errorf(exitcode.ExitIO, "--key %s: %w", k, err)
			}
			sc := bufio.NewScanner(f)
			n := 0
			for sc.Scan() {
				l := strings.TrimSpace(sc.Text())
				if l == "" || strings.HasPrefix(l, "#") {
					continue
				}
				out = append(out, l)
				n++
			}
			f.Close()
			if err := sc.Err(); err != nil {
				return nil, exitcode.Errorf(exitcode.ExitIO, "--key %s: %w", k, err)
			}
			if n == 0 {
				return nil, exitcode.Errorf(exitcode.ExitUsage, "--key %s: the file holds no key", k)
			}
			continue
		}
		out = append(out, k)
	}
	if _, err := auditlog.ParseKeys(out); err != nil {
		return nil, verifyErr(err)
	}
	return out, nil
}

// verifyErr gives a library error its exit code (keeping an existing one).
func verifyErr(err error) error {
	var ue *exitcode.Error
	if errors.As(err, &ue) {
		return err
	}
	var ve *record.VerifyError
	if errors.As(err, &ve) {
		return exitcode.WithCode(failureCode(ve), err)
	}
	return exitcode.WithCode(exitcode.ExitIO, err)
}

// failureCode is the exit code for a verification failure: the code of an
// underlying error that has one (e.g. from the genesis evidence check),
// else the code of its class.
func failureCode(ve *record.VerifyError) int {
	var c exitcode.Coder
	if ve.Err != nil && errors.As(ve.Err, &c) {
		return c.ExitCode()
	}
	var ue *exitcode.Error
	if ve.Err != nil && errors.As(ve.Err, &ue) {
		return ue.Code
	}
	return exitcode.LogFailureCode(string(ve.Class))
}

type checkpointDoc struct {
	Origin string `json:"origin"`
	Size   int64  `json:"size"`
	Root   string `json:"root"`
	Note   string `json:"note"`
}

type verifyChainDoc struct {
	SchemaVersion int                     `json:"schema_version"`
	Status        string                  `json:"status"` // verified, failed
	Dir           string                  `json:"dir"`
	Epochs        []*auditlog.EpochResult `json:"epochs"`
	// Records, First and Last are about the records a checkpoint signs
	// (each epoch's up to its last checkpoint); UnsignedRecords counts
	// the others (the unsealed tail, the UNSIGNED ranges).
	Records         int64                     `json:"records"`
	UnsignedRecords int64                     `json:"unsigned_records"`
	Checkpoints     int                       `json:"checkpoints"`
	First           *time.Time                `json:"first,omitempty"`
	Last            *time.Time                `json:"last,omitempty"`
	KeysTrusted     bool                      `json:"keys_trusted"`
	Newest          *checkpointDoc            `json:"newest_checkpoint,omitempty"`
	NewestEpoch     int                       `json:"newest_checkpoint_epoch,omitempty"` // the epoch newest_checkpoint belongs to
	Unsealed        int64                     `json:"unsealed_tail"`
	Unsigned        []auditlog.UnsignedRange  `json:"unsigned"` // records of earlier epochs their key never signed
	External        []*auditlog.ExternalCheck `json:"external_checkpoints"`
	Stray           []string                  `json:"stray"` // entries of the directory that are not part of the log
	// Log is the gateway's stable log identity and, with --witness, the
	// newest checkpoint's cosignatures; TailProtected says whether
	// truncation and forks of the tail were checked (a saved checkpoint or
	// witnesses), which the warnings otherwise say they were not.
	Log           *auditlog.LogReport          `json:"log,omitempty"`
	TailProtected string                       `json:"tail_protected_by"` // witnesses, saved-checkpoint, none
	Warnings      []string                     `json:"warnings"`
	Evidence      []*attestedlog.GenesisResult `json:"evidence"`
	Failure       *record.VerifyError          `json:"failure,omitempty"`
	ExitCode      int                          `json:"exit_code"`
}

// The JSON documents of verify-chain's other modes (docs/schema).
type (
	// failedDoc: --proof, --segment or --receipt that failed verification.
	failedDoc struct {
		SchemaVersion int                 `json:"schema_version"`
		Status        string              `json:"status"`
		Failure       *record.VerifyError `json:"failure"`
	}
	// proveDoc: --prove N.
	proveDoc struct {
		SchemaVersion int    `json:"schema_version"`
		Index         int64  `json:"index"`
		Proof         string `json:"proof"`
	}
	// proofDoc: --proof FILE, verified.
	proofDoc struct {
		SchemaVersion int            `json:"schema_version"`
		Status        string         `json:"status"`
		Index         int64          `json:"index"`
		Kind          string         `json:"kind"`
		Checkpoint    *checkpointDoc `json:"checkpoint"`
		Record        string         `json:"record"`
	}
	// segmentDoc: --segment FILE.
	segmentDoc struct {
		SchemaVersion int    `json:"schema_version"`
		Status        string `json:"status"`
		*excerpt.SegmentResult
		Newest   *checkpointDoc      `json:"newest_checkpoint,omitempty"`
		Failure  *record.VerifyError `json:"failure,omitempty"`
		ExitCode int                 `json:"exit_code"`
	}
	// receiptCheckDoc: --receipt FILE, verified.
	receiptCheckDoc struct {
		SchemaVersion int    `json:"schema_version"`
		Status        string `json:"status"`
		*excerpt.ReceiptResult
		Checkpoint *checkpointDoc               `json:"checkpoint"`
		Evidence   []*attestedlog.GenesisResult `json:"evidence"`
	}
	// fleetDoc: several audit directories.
	fleetDoc struct {
		SchemaVersion int         `json:"schema_version"`
		Status        string      `json:"status"`
		Gateways      []*fleetRow `json:"gateways"`
		ExitCode      int         `json:"exit_code"`
	}
)

func cpDoc(cp *c2sp.Checkpoint) *checkpointDoc {
	if cp == nil {
		return nil
	}
	return &checkpointDoc{Origin: cp.Origin, Size: cp.Size, Root: cp.Root.String(), Note: string(cp.Note)}
}

// loadWitnesses expands --witness values that name files and checks them.
func (o *verifyChainOptions) loadWitnesses() ([]string, error) {
	var out []string
	for _, k := range o.Witnesses {
		if fi, err := os.Stat(k); err == nil && fi.Mode().IsRegular() {
			b, err := os.ReadFile(k)
			if err != nil {
				return nil, exitcode.Errorf(exitcode.ExitIO, "--witness %s: %w", k, err)
			}
			n := 0
			for _, l := range strings.Split(string(b), "\n") {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
					out = append(out, l)
					n++
				}
			}
			if n == 0 {
				return nil, exitcode.Errorf(exitcode.ExitUsage, "--witness %s: the file holds no key", k)
			}
			continue
		}
		out = append(out, k)
	}
	for _, k := range out {
		if _, err := c2sp.NewCosignatureVerifier(k); err != nil {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "--witness: %v", err).Hint("give the witness's cosignature verifier key, as it publishes it (litewitness logs it at start: vkey=...)")
		}
	}
	if o.WitnessQuorum < 0 || o.WitnessQuorum > len(out) {
		return nil, exitcode.Errorf(exitcode.ExitUsage, "--witness-quorum %d: want 1 to the number of --witness keys (%d)", o.WitnessQuorum, len(out))
	}
	if len(out) == 0 && o.WitnessMaxAge != 0 {
		return nil, exitcode.Errorf(exitcode.ExitUsage, "--witness-max-age needs --witness")
	}
	if o.WitnessMaxAge < 0 {
		return nil, exitcode.Errorf(exitcode.ExitUsage, "--witness-max-age %s: want a positive duration", o.WitnessMaxAge)
	}
	return out, nil
}

func runVerifyChain(p *ui.Printer, dir string, o *verifyChainOptions, keys []string) error {
	opt, ce, err := o.verifyOptions(keys)
	if err != nil {
		return err
	}
	prog := p.Progress("verifying", auditlog.LogBytes(dir))
	opt.Progress = prog.Add
	rep, err := auditlog.Verify(dir, opt)
	prog.Done()

	var ve *record.VerifyError
	if err != nil && !errors.As(err, &ve) {
		return exitcode.WithCode(exitcode.ExitIO, err)
	}
	code := exitcode.ExitOK
	if ve != nil {
		code = failureCode(ve)
	} else if w := ce.UnmeasuredWarning(); w != "" {
		rep.Warnings = append(rep.Warnings, w)
	}
	// A log that holds no checkpoint is well-formed, but nothing in it is
	// signed: it is reported, and not verified.
	var unsigned *record.VerifyError
	if ve == nil && rep.Newest == nil {
		unsigned = &record.VerifyError{Class: record.ClassUnsigned, Pos: record.Position{Epoch: rep.Epochs[len(rep.Epochs)-1].Epoch},
			Msg:  "no checkpoint in the log signs any of its records: anyone able to write the directory could have written them",
			Hint: "if the gateway has just started, verify again after its first checkpoint (by default it signs one within a second)"}
		code = failureCode(unsigned)
	}
	if p.JSONOut {
		if err := p.JSON(newVerifyChainDoc(dir, rep, ce, ve, unsigned, code)); err != nil {
			return exitcode.WithCode(exitcode.ExitIO, err)
		}
	} else if ve != nil {
		if ve.IsVerification() {
			printFailure(p, ve)
		}
	} else {
		printReport(p, rep)
		ce.print(p)
	}
	if ve != nil {
		return exitcode.WithCode(code, ve)
	}
	if unsigned != nil {
		return exitcode.WithCode(code, unsigned)
	}
	if o.SaveCheckpoint != "" {
		return saveCheckpoint(p, o.SaveCheckpoint, rep)
	}
	return nil
}

// verifyOptions turns the flags into auditlog's options: the keys, the
// witnesses, the genesis evidence check (returned too, for its report)
// and the checkpoints the log must extend.
func (o *verifyChainOptions) verifyOptions(keys []string) (auditlog.VerifyOptions, *chainEvidence, error) {
	opt := auditlog.VerifyOptions{Keys: keys, RequireSigned: o.RequireSigned || o.Evidence.RequireAttested, Strict: o.Strict}
	wits, err := o.loadWitnesses()
	if err != nil {
		return opt, nil, err
	}
	opt.Witnesses, opt.WitnessQuorum, opt.WitnessMaxAge = wits, o.WitnessQuorum, o.WitnessMaxAge
	ce, err := newChainEvidence(&o.Evidence)
	if err != nil {
		return opt, nil, err
	}
	opt.VerifyEvidence = ce.Check
	opt.Checkpoints, err = o.loadCheckpoints()
	if err != nil {
		return opt, nil, err
	}
	return opt, ce, nil
}

// loadCheckpoints reads the --checkpoint files and the checkpoint
// already in the --save-checkpoint file, if any.
func (o *verifyChainOptions) loadCheckpoints() ([][]byte, error) {
	var out [][]byte
	for _, f := range o.Checkpoints {
		b, err := readInput(f)
		if err != nil {
			return nil, exitcode.Errorf(exitcode.ExitIO, "--checkpoint: %w", err)
		}
		if _, err := c2sp.ParseCheckpoint(b); err != nil {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "--checkpoint %s: %v", f, err).
				Hint("give a checkpoint note saved earlier with --save-checkpoint (origin, size, root hash, a blank line, signatures)")
		}
		out = append(out, b)
	}
	// A checkpoint already saved in the --save-checkpoint file is checked
	// before it is replaced: otherwise a log rolled back since would
	// overwrite the one record that proves the rollback.
	if o.SaveCheckpoint != "" && !slices.ContainsFunc(o.Checkpoints, func(f string) bool { return sameFile(f, o.SaveCheckpoint) }) {
		b, err := os.ReadFile(o.SaveCheckpoint)
		switch {
		case err == nil:
			if _, perr := c2sp.ParseCheckpoint(b); perr != nil {
				return nil, exitcode.Errorf(exitcode.ExitUsage, "--save-checkpoint %s: the file exists and holds no checkpoint: %v", o.SaveCheckpoint, perr).
					Hint("choose another file, or remove this one if it is not a checkpoint you saved")
			}
			out = append(out, b)
		case !errors.Is(err, os.ErrNotExist):
			return nil, exitcode.Errorf(exitcode.ExitIO, "--save-checkpoint: %w", err)
		}
	}
	return out, nil
}

// newVerifyChainDoc is the JSON document of a verified or failed log:
// empty lists as [], not null; unsigned, when the log holds no
// checkpoint, is its failure.
func newVerifyChainDoc(dir string, rep *auditlog.Report, ce *chainEvidence, ve, unsigned *record.VerifyError, code int) verifyChainDoc {
	doc := verifyChainDoc{SchemaVersion: ui.SchemaVersion, Status: "verified", Dir: dir, Epochs: rep.Epochs, Records: rep.SignedRecords, UnsignedRecords: rep.Records - rep.SignedRecords,
		Checkpoints: rep.Checkpoints, KeysTrusted: rep.KeysTrusted, Newest: cpDoc(rep.Newest), NewestEpoch: rep.NewestEpoch, Unsealed: rep.Unsealed, Unsigned: rep.Unsigned,
		External: rep.External, Log: rep.Log, TailProtected: tailProtection(rep), Warnings: rep.Warnings, Stray: rep.Stray, Evidence: ce.Results, Failure: ve, ExitCode: code}
	if doc.Epochs == nil {
		doc.Epochs = []*auditlog.EpochResult{}
	}
	if doc.External == nil {
		doc.External = []*auditlog.ExternalCheck{}
	}
	if doc.Warnings == nil {
		doc.Warnings = []string{}
	}
	if doc.Stray == nil {
		doc.Stray = []string{}
	}
	if doc.Unsigned == nil {
		doc.Unsigned = []auditlog.UnsignedRange{}
	}
	if !rep.SignedFirst.IsZero() {
		doc.First, doc.Last = &rep.SignedFirst, &rep.SignedLast
	}
	if ve != nil {
		doc.Status = "failed"
	} else if unsigned != nil {
		doc.Status, doc.Failure = "failed", unsigned
	}
	return doc
}

// saveCheckpoint writes the newest verified checkpoint to file
// (--save-checkpoint).
func saveCheckpoint(p *ui.Printer, file string, rep *auditlog.Report) error {
	if rep.Newest == nil {
		return exitcode.Errorf(exitcode.ExitIO, "--save-checkpoint: the log has no checkpoint to save")
	}
	if err := writeFileAtomic(file, rep.Newest.Note); err != nil {
		return exitcode.Errorf(exitcode.ExitIO, "--save-checkpoint: %w", err)
	}
	if !p.JSONOut {
		p.Printf("Saved checkpoint %s size %d to %s\n", rep.Newest.Origin, rep.Newest.Size, file)
	}
	return nil
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func printReport(p *ui.Printer, rep *auditlog.Report) {
	segs := 0
	for _, e := range rep.Epochs {
		segs += e.Segments
	}
	check := p.OK("✓")
	warn := p.Warn("!")
	p.Printf("Verified audit log %s\n", p.Bold(rep.Dir))
	// Counted and dated: the records a checkpoint signs, and no other.
	if rep.SignedRecords > 0 {
		p.Printf("  %s %d signed records (checkpoints included) in %s, %s (%s to %s)\n", check, rep.SignedRecords, plural(len(rep.Epochs), "epoch"), plural(segs, "segment file"),
			rep.SignedFirst.Format(time.RFC3339), rep.SignedLast.Format(time.RFC3339))
	} else {
		p.Printf("  %s no signed record in %s, %s\n", warn, plural(len(rep.Epochs), "epoch"), plural(segs, "segment file"))
	}
	if n := rep.Records - rep.SignedRecords; n > 0 {
		p.Printf("  %s %d records no signature covers (the newest epoch's unsealed tail, a crashed epoch's UNSIGNED records): not in the count or the dates above\n", warn, n)
	}
	p.Printf("  %s every line is strict RFC 8785 canonical JSON; sequence numbers contiguous; hash links intact\n", check)
	if rep.Checkpoints == 0 {
		p.Printf("  %s no checkpoint: no signature covers any record\n", warn)
	} else {
		p.Printf("  %s %s: signatures valid, Merkle roots match the records, each consistent with the one before\n", check, plural(rep.Checkpoints, "checkpoint"))
	}
	if len(rep.Epochs) > 1 {
		p.Printf("  %s epoch chain: each genesis names its predecessor's size and root, and they match\n", check)
	}
	if rep.KeysTrusted {
		p.Printf("  %s every epoch's key is a trusted key (--key), and every checkpoint is signed by its epoch's key\n", check)
	}
	for _, u := range rep.Unsigned {
		p.Printf("  %s UNSIGNED: records %d-%d of epoch %d were never signed by its key (see below)\n", warn, u.First, u.Last, u.Epoch)
	}
	if rep.Unsealed == 0 {
		p.Printf("  %s unsealed tail: none; every record of the newest epoch is covered by a signed checkpoint\n", check)
	}
	if rep.Log != nil {
		p.Printf("  %s log identity %s: one log tree over every epoch (%s), each genesis binds it\n", check, rep.Log.Origin, plural(int(rep.Log.Size), "record"))
		if rep.Log.Cosigned > 0 {
			p.Printf("  %s %s kept in the log: signed by the log key, roots match the records, every cosignature of a given witness valid\n", check, plural(rep.Log.Cosigned, "cosigned log checkpoint"))
		}
	}
	if wc := witnessedOf(rep); wc != nil {
		p.Printf("  %s WITNESSED: the newest checkpoint (log size %d) is cosigned by %s (quorum %d) as of %s: truncation and forks of the tail are detected without a saved checkpoint\n",
			check, wc.Size, strings.Join(wc.Witnesses, ", "), wc.Quorum, wc.Time.Format(time.RFC3339))
	}
	for _, x := range rep.External {
		p.Printf("  %s consistent with the saved checkpoint %s size %d (epoch %d now has %d records)\n", check, x.Origin, x.Size, x.Epoch, x.Records)
	}
	rows := make([][]string, 0, len(rep.Epochs))
	for _, e := range rep.Epochs {
		sealed := "yes"
		if !e.Sealed {
			sealed = "no"
		}
		key := e.Key
		if parts := strings.SplitN(key, "+", 3); len(parts) == 3 {
			key = parts[0] + "+" + parts[1]
		}
		rows = append(rows, []string{fmt.Sprint(e.Epoch), key, fmt.Sprint(e.Records), fmt.Sprint(e.Checkpoints), fmt.Sprint(e.Unsealed), sealed})
	}
	p.Table([]string{"epoch", "signer (origin+key hash)", "records", "checkpoints", "unsealed", "sealed"}, rows)
	for _, w := range rep.Warnings {
		p.Printf("  %s %s\n", warn, w)
	}
	last := rep.Epochs[len(rep.Epochs)-1]
	if rep.Newest == nil {
		p.Printf("Result: %s: no checkpoint in the log signs any of its records\n", p.Bad("NOT VERIFIED"))
		return
	}
	// Records are numbered from 0 in each epoch, and a checkpoint is a
	// record itself: the one at index N signs records 0..N-1 (tree size N).
	n := rep.Newest.Size
	if rep.NewestEpoch == last.Epoch {
		p.Printf("Result: %s through record %d of epoch %d: records 0-%d (%s) are signed by the newest checkpoint, which is record %d (tree size %d, root %s)\n",
			p.OK("VERIFIED"), n-1, last.Epoch, n-1, plural(int(n), "record"), n, n, rep.Newest.Root)
		return
	}
	// The newest epoch has no checkpoint yet: the result is what the last
	// signed one, in an earlier epoch, covers.
	p.Printf("Result: %s through record %d of epoch %d: records 0-%d (%s) are signed by epoch %d's last checkpoint, which is record %d (tree size %d, root %s); no checkpoint of epoch %d (the newest) signs any of its records\n",
		p.OK("VERIFIED"), n-1, rep.NewestEpoch, n-1, plural(int(n), "record"), rep.NewestEpoch, n, n, rep.Newest.Root, last.Epoch)
}

func printFailure(p *ui.Printer, ve *record.VerifyError) {
	p.Printf("%s %s\n", p.Bad("FAIL"), p.Bold(string(ve.Class)))
	p.Printf("  %s\n", strings.ReplaceAll(ve.Msg, "\n", "\n  "))
	if ve.Pos.Epoch > 0 {
		p.Printf("  epoch:     %d\n", ve.Pos.Epoch)
	}
	if ve.Pos.File != "" {
		p.Printf("  file:      %s\n", ve.Pos.File)
		if ve.Pos.Line > 0 {
			p.Printf("  line:      %d\n", ve.Pos.Line)
		}
		p.Printf("  offset:    byte %d\n", ve.Pos.Offset)
		p.Printf("  record:    %d", ve.Pos.Index)
		if ve.Pos.Kind != "" {
			p.Printf(" (%s)", ve.Pos.Kind)
		}
		p.Printf("\n")
	}
	if ve.Expected != "" || ve.Computed != "" {
		p.Printf("  expected:  %s\n  computed:  %s\n", ve.Expected, ve.Computed)
	}
	if ve.LastGood > 0 {
		p.Printf("  last good checkpoint: size %d (records 0-%d verified)\n", ve.LastGood, ve.LastGood-1)
	}
	if ve.Pos.Record != "" {
		p.Printf("  line text: %s\n", p.Dim(ve.Pos.Record))
	}
}

func runProve(p *ui.Printer, dir string, o *verifyChainOptions, keys []string) error {
	if len(o.Checkpoints) > 0 || o.SaveCheckpoint != "" {
		return exitcode.Errorf(exitcode.ExitUsage, "--prove makes a proof; run --checkpoint and --save-checkpoint separately")
	}
	prog := p.Progress("verifying", auditlog.LogBytes(dir))
	pr, err := excerpt.Prove(dir, o.Epoch, o.Prove, auditlog.VerifyOptions{Keys: keys, Progress: prog.Add})
	prog.Done()
	if err != nil {
		return verifyErr(err)
	}
	text := pr.Format()
	if p.JSONOut {
		return p.JSON(proveDoc{ui.SchemaVersion, pr.Index, string(text)})
	}
	_, err = p.Out.Write(text)
	return err
}

func runVerifyProof(p *ui.Printer, file string, keys []string) error {
	b, err := readInput(file)
	if err != nil {
		return exitcode.Errorf(exitcode.ExitIO, "--proof: %w", err)
	}
	res, err := excerpt.VerifyProof(b, keys)
	if err != nil {
		var ve *record.VerifyError
		if errors.As(err, &ve) && ve.Class == record.ClassUsage {
			return exitcode.WithCode(exitcode.ExitUsage, err)
		}
		if p.JSONOut {
			p.JSON(failedDoc{ui.SchemaVersion, "failed", ve})
		}
		return verifyErr(err)
	}
	if p.JSONOut {
		return p.JSON(proofDoc{ui.SchemaVersion, "verified", res.Index, string(res.Kind), cpDoc(res.Checkpoint), string(res.Record)})
	}
	p.Printf("%s record %d (%s) is included in %s at tree size %d\n", p.OK("✓"), res.Index, res.Kind, res.Checkpoint.Origin, res.Checkpoint.Size)
	p.Printf("  checkpoint signed by a trusted key; root %s\n", res.Checkpoint.Root)
	p.Printf("  record: %s\n", string(res.Record))
	return nil
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func runVerifySegment(p *ui.Printer, file string, keys []string) error {
	res, err := excerpt.VerifySegment(file, auditlog.VerifyOptions{Keys: keys})
	var ve *record.VerifyError
	if err != nil && !errors.As(err, &ve) {
		return verifyErr(err)
	}
	// A file without a checkpoint of its own (ClassUnsigned) is reported
	// like a verified one, with NOT VERIFIED as its result: its records
	// are well-formed and linked, but nothing signs them.
	unsigned := ve != nil && ve.Class == record.ClassUnsigned
	if err != nil && !unsigned {
		if ve.IsVerification() {
			if p.JSONOut {
				p.JSON(failedDoc{ui.SchemaVersion, "failed", ve})
			} else {
				printFailure(p, ve)
			}
		}
		return verifyErr(err)
	}
	if p.JSONOut {
		doc := segmentDoc{ui.SchemaVersion, "verified", res, cpDoc(res.LastCheckpoint), nil, exitcode.ExitOK}
		if unsigned {
			doc.Status, doc.Failure, doc.ExitCode = "failed", ve, failureCode(ve)
		}
		if err := p.JSON(doc); err != nil {
			return exitcode.WithCode(exitcode.ExitIO, err)
		}
		return verifyErr(err)
	}
	check, warn := p.OK("✓"), p.Warn("!")
	last := res.FirstIndex + res.Records - 1
	if unsigned {
		p.Printf("Segment %s of %s\n", p.Bold(file), res.Origin)
	} else {
		p.Printf("Verified segment %s of %s\n", p.Bold(file), res.Origin)
	}
	p.Printf("  %s records %d-%d: strict canonical JSON, sequence contiguous, hash links intact\n", check, res.FirstIndex, last)
	if unsigned {
		p.Printf("  %s no checkpoint in the file: no signature covers records %d-%d\n", warn, res.FirstIndex, last)
	} else {
		p.Printf("  %s %s in the file: signatures by a trusted key valid, roots match the frontier and the records\n", check, plural(res.Checkpoints, "checkpoint"))
		if res.Unsealed > 0 {
			p.Printf("  %s unsealed tail: %d records after the file's last checkpoint are not covered by any signature\n", warn, res.Unsealed)
		} else {
			p.Printf("  %s unsealed tail: none\n", check)
		}
	}
	if res.TornBytes > 0 {
		p.Printf("  %s the file ends with an incomplete line of %d bytes (the writer stopped mid-write)\n", warn, res.TornBytes)
	}
	p.Printf("  %s this checks one file: records in other segments and epochs, and truncation, are not covered\n", warn)
	epoch := ""
	if res.Epoch > 0 {
		epoch = fmt.Sprintf(" of epoch %d", res.Epoch)
	}
	if unsigned {
		p.Printf("Result: %s: none of the file's records %d-%d is signed; anyone able to write the file could have written every record after its first\n",
			p.Bad("NOT VERIFIED"), res.FirstIndex, last)
		return verifyErr(err)
	}
	// As for a whole log: the checkpoint at index N signs records 0..N-1.
	cp := res.LastCheckpoint
	from := res.FirstIndex
	through := *res.CoveredThrough
	p.Printf("Result: %s through record %d%s: the file's records %d-%d (%s) are signed by its last checkpoint, which is record %d (tree size %d, root %s)\n",
		p.OK("VERIFIED"), through, epoch, from, through, plural(int(through-from+1), "record"), cp.Size, cp.Size, cp.Root)
	return nil
}

// sameFile reports whether paths a and b name the same existing file.
func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

func witnessedOf(rep *auditlog.Report) *auditlog.WitnessedCheckpoint {
	if rep == nil || rep.Log == nil {
		return nil
	}
	return rep.Log.Witnessed
}

// tailProtection names what detected truncation and forks of the tail.
func tailProtection(rep *auditlog.Report) string {
	switch {
	case witnessedOf(rep) != nil:
		return "witnesses"
	case rep != nil && len(rep.External) > 0:
		return "saved-checkpoint"
	}
	return "none"
}

func runMakeReceipt(p *ui.Printer, dir string, o *verifyChainOptions, keys []string) error {
	if len(o.Checkpoints) > 0 || o.SaveCheckpoint != "" {
		return exitcode.Errorf(exitcode.ExitUsage, "--make-receipt writes a receipt; run --checkpoint and --save-checkpoint separately")
	}
	ce, err := newChainEvidence(&o.Evidence)
	if err != nil {
		return err
	}
	r, err := excerpt.MakeReceipt(dir, o.MakeReceipt, auditlog.VerifyOptions{Keys: keys, VerifyEvidence: ce.Check})
	if err != nil {
		return verifyErr(err)
	}
	b, err := r.Encode()
	if err != nil {
		return exitcode.WithCode(exitcode.ExitIO, err)
	}
	_, err = p.Out.Write(b)
	return err
}

func runVerifyReceipt(p *ui.Printer, o *verifyChainOptions, keys []string) error {
	b, err := readInput(o.Receipt)
	if err != nil {
		return exitcode.Errorf(exitcode.ExitIO, "--receipt: %w", err)
	}
	wits, err := o.loadWitnesses()
	if err != nil {
		return err
	}
	ce, err := newChainEvidence(&o.Evidence)
	if err != nil {
		return err
	}
	opt := excerpt.ReceiptOptions{Keys: keys, Witnesses: wits, WitnessQuorum: o.WitnessQuorum, VerifyEvidence: ce.Check}
	res, err := excerpt.VerifyReceipt(b, opt)
	if err != nil {
		var ve *record.VerifyError
		if errors.As(err, &ve) && ve.Class == record.ClassUsage {
			return exitcode.WithCode(exitcode.ExitUsage, err)
		}
		if p.JSONOut {
			p.JSON(failedDoc{ui.SchemaVersion, "failed", ve})
		} else if ve != nil {
			printFailure(p, ve)
		}
		return verifyErr(err)
	}
	if p.JSONOut {
		return p.JSON(receiptCheckDoc{ui.SchemaVersion, "verified", res, cpDoc(res.Checkpoint), ce.Results})
	}
	check, warn := p.OK("✓"), p.Warn("!")
	p.Printf("Verified session receipt %s\n", p.Bold(res.Session))
	kinds := make([]string, 0, len(res.Kinds))
	for k, n := range res.Kinds {
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	slices.Sort(kinds)
	p.Printf("  %s %s of session %s (%s), each canonical and included in epoch %d's checkpoint (tree size %d, root %s)\n",
		check, plural(res.Records, "record"), res.Session, strings.Join(kinds, ", "), res.Epoch, res.Checkpoint.Size, res.Checkpoint.Root)
	p.Printf("  %s the checkpoint is signed by the key the epoch's genesis names (%s), and the genesis is in the tree\n", check, res.Origin)
	p.Printf("  %s payloads stay sealed: the records hold commitments (HMAC), not the arguments and results\n", check)
	if res.KeysTrusted {
		p.Printf("  %s the epoch's key is a trusted key (--key)\n", check)
	}
	ce.print(p)
	if w := res.Log; w != nil {
		p.Printf("  %s WITNESSED: the checkpoint's record is in log %s at size %d, cosigned by %s (quorum %d) as of %s\n",
			check, res.LogOrigin, w.Size, strings.Join(w.Witnesses, ", "), w.Quorum, w.Time.Format(time.RFC3339))
	}
	for _, w := range res.Warnings {
		p.Printf("  %s %s\n", warn, w)
	}
	p.Printf("Result: %s: what the gateway recorded for session %s is in the log it signed\n", p.OK("VERIFIED"), res.Session)
	return nil
}

// fleetRow is one gateway's verdict in a fleet verification.
type fleetRow struct {
	Dir       string              `json:"dir"`
	Status    string              `json:"status"`
	Origin    string              `json:"log_origin,omitempty"`
	Epochs    int                 `json:"epochs"`
	Records   int64               `json:"records"`
	Witnessed []string            `json:"witnessed_by"`
	Sealed    bool                `json:"sealed"`
	Warnings  []string            `json:"warnings"`
	Failure   *record.VerifyError `json:"failure,omitempty"`
	ExitCode  int                 `json:"exit_code"`
}

func runVerifyFleet(p *ui.Printer, dirs []string, o *verifyChainOptions, keys []string) error {
	wits, err := o.loadWitnesses()
	if err != nil {
		return err
	}
	var rows []*fleetRow
	var first *record.VerifyError
	code := exitcode.ExitOK
	origins := map[string]string{}
	for _, dir := range dirs {
		ce, err := newChainEvidence(&o.Evidence)
		if err != nil {
			return err
		}
		opt := auditlog.VerifyOptions{Keys: keys, RequireSigned: o.RequireSigned || o.Evidence.RequireAttested, Strict: o.Strict, VerifyEvidence: ce.Check,
			Witnesses: wits, WitnessQuorum: o.WitnessQuorum, WitnessMaxAge: o.WitnessMaxAge}
		rep, err := auditlog.Verify(dir, opt)
		row := &fleetRow{Dir: dir, Status: "verified", Witnessed: []string{}, Warnings: []string{}}
		var ve *record.VerifyError
		if err != nil && !errors.As(err, &ve) {
			ve = &record.VerifyError{Class: record.ClassIO, Msg: err.Error()}
		}
		if ve == nil && rep.Newest == nil {
			ve = &record.VerifyError{Class: record.ClassUnsigned, Msg: "no checkpoint in the log signs any of its records"}
		}
		if rep != nil {
			row.Epochs, row.Records, row.Warnings = len(rep.Epochs), rep.Records, append(row.Warnings, rep.Warnings...)
			if len(rep.Epochs) > 0 {
				row.Sealed = rep.Epochs[len(rep.Epochs)-1].Sealed
			}
			if rep.Log != nil {
				row.Origin = rep.Log.Origin
				if rep.Log.Witnessed != nil {
					row.Witnessed = rep.Log.Witnessed.Witnesses
				}
			}
		}
		if ve == nil && row.Origin != "" {
			if other, ok := origins[row.Origin]; ok {
				ve = &record.VerifyError{Class: record.ClassIntegrity, Msg: fmt.Sprintf("log origin %s is also the origin of %s: each gateway of a fleet keeps its own log identity", row.Origin, other)}
			}
			origins[row.Origin] = dir
		}
		if ve != nil {
			row.Status, row.Failure, row.ExitCode = "failed", ve, failureCode(ve)
			if first == nil {
				first, code = ve, row.ExitCode
			}
		}
		rows = append(rows, row)
	}
	if p.JSONOut {
		status := "verified"
		if first != nil {
			status = "failed"
		}
		if err := p.JSON(fleetDoc{ui.SchemaVersion, status, rows, code}); err != nil {
			return exitcode.WithCode(exitcode.ExitIO, err)
		}
	} else {
		printFleet(p, rows, first == nil)
	}
	if first != nil {
		return exitcode.WithCode(code, first)
	}
	return nil
}

// printFleet prints the fleet's table, each log's failure and warnings, and
// the result (verified: every log verified).
func printFleet(p *ui.Printer, rows []*fleetRow, verified bool) {
	p.Printf("Fleet of %s\n", plural(len(rows), "audit log"))
	tr := make([][]string, 0, len(rows))
	for _, r := range rows {
		verdict := p.OK("VERIFIED")
		if r.Failure != nil {
			verdict = p.Bad("FAIL " + string(r.Failure.Class))
		}
		wit := "-"
		if len(r.Witnessed) > 0 {
			wit = strings.Join(r.Witnessed, ", ")
		}
		origin := r.Origin
		if origin == "" {
			origin = "-"
		}
		tr = append(tr, []string{r.Dir, origin, fmt.Sprint(r.Epochs), fmt.Sprint(r.Records), wit, verdict})
	}
	p.Table([]string{"gateway log", "log origin", "epochs", "records", "witnessed by", "verdict"}, tr)
	for _, r := range rows {
		if r.Failure != nil {
			p.Printf("  %s %s: %s\n", p.Bad("✗"), r.Dir, r.Failure.Error())
		}
		for _, w := range r.Warnings {
			p.Printf("  %s %s: %s\n", p.Warn("!"), r.Dir, w)
		}
	}
	if verified {
		p.Printf("Result: %s: all %s\n", p.OK("VERIFIED"), plural(len(rows), "audit log"))
	} else {
		p.Printf("Result: %s\n", p.Bad("NOT VERIFIED"))
	}
}
