package auditlog

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/merkle"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	jsonv2 "github.com/go-json-experiment/json"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Defaults for Options.
const (
	DefaultCheckpointEvery    = 1000
	DefaultCheckpointInterval = time.Second
	DefaultSyncInterval       = 100 * time.Millisecond
	DefaultSegmentBytes       = 256 << 20
	DefaultName               = "cmcp.local/audit"
	maxBatch                  = 4096
)

// Options configure a new epoch.
type Options struct {
	// Key signs the epoch's checkpoints. Required. Generate it per boot
	// (inside the CVM) and bind its public half to the attestation.
	Key ed25519.PrivateKey
	// Name prefixes the origin. The origin of the epoch (and the note key
	// name) is Name + "/epoch-NNNNNN-<8 random hex>". Default DefaultName.
	// It must not contain spaces or '+'.
	Name string
	// Durability is strict, group (default) or interval.
	Durability string
	// SyncInterval is the fdatasync period of the interval mode (default 100ms).
	SyncInterval time.Duration
	// CheckpointEvery and CheckpointInterval set the checkpoint cadence: a
	// checkpoint after that many records or that much time with new records,
	// whichever comes first (defaults 1000 and 1s).
	CheckpointEvery    int64
	CheckpointInterval time.Duration
	// SegmentBytes rotates to a new segment file beyond this size (default 256 MiB).
	SegmentBytes int64
	// Genesis content supplied by the gateway.
	Gateway       record.GatewayInfo
	ConfigDigest  digest.Digest
	PolicyDigest  digest.Digest
	CatalogDigest digest.Digest
	PolicyMode    string
	Extra         json.RawMessage
	// Evidence, if set, is called once with the statement (the digest of the
	// genesis body without statement and evidence) and the public key; the
	// evidence it returns (JSON, e.g. a pkg/evidence bundle binding the key,
	// a nonce and the statement) is stored in the genesis record.
	Evidence func(statement digest.Digest, pub ed25519.PublicKey) (json.RawMessage, error)
	// Recipients are age recipients (age1...) of the auditors. With them
	// the epoch commitment secret is sealed into the genesis record, so a
	// holder of a matching identity can open commitments. Without them the
	// commitments can never be opened.
	Recipients []string
	// Vault keeps every committed payload, encrypted with age to
	// Recipients, in the epoch's vault.jsonl. Requires Recipients.
	Vault bool
	// OnCheckpoint is called (with the writer's lock held, from the
	// committer goroutine or from an Append that commits its own record;
	// keep it short and never call the Writer from it) with each new
	// signed checkpoint once it is durable, e.g. to hand it to a goroutine
	// that exports it to a witness or a remote sink.
	OnCheckpoint func(note []byte)
	// Log, if set, gives the gateway a stable log identity across epochs
	// (FORMAT.md section 11): the genesis binds it, and after every durable
	// checkpoint record the writer signs a log checkpoint with its key.
	Log *LogIdentity
}

// Receipt tells an appender where its record went.
type Receipt struct {
	Epoch   int
	Index   int64     // record index (seq) in the epoch
	Hash    tlog.Hash // leaf hash
	Time    time.Time // the record's ts
	Durable bool      // fdatasync'd (false in interval mode)
}

// ErrClosed is returned by Append after Close.
// ErrInUse is what Open's error wraps when another writer (another
// gateway) holds the audit directory's lock.
var ErrInUse = logdir.ErrInUse

var ErrClosed = errors.New("audit log is closed")

// FatalError wraps the write or sync error that made a Writer unusable.
// Every Append after it returns the same error: the writer never drops a
// record silently.
type FatalError struct{ Err error }

func (e *FatalError) Error() string {
	return fmt.Sprintf("audit log is unusable after a write error (restart; recovery cuts an incomplete tail): %v", e.Err)
}
func (e *FatalError) Unwrap() error { return e.Err }

type pending struct {
	kind record.Kind
	body []byte
	res  Receipt
	err  error
	done chan struct{} // buffered: the committer sends once res and err are set
}

// pendingPool recycles an Append's pending record, its body buffer and its
// channel once Append has received the committer's answer (an Append that
// gives up on its context leaves its pending to the garbage collector).
var pendingPool = sync.Pool{New: func() any { return &pending{body: make([]byte, 0, 1024), done: make(chan struct{}, 1)} }}

// maxPooledBody bounds the body buffers kept for reuse.
const maxPooledBody = 64 << 10

func putPending(p *pending) {
	if cap(p.body) > maxPooledBody {
		p.body = nil
	}
	p.body, p.res, p.err = p.body[:0], Receipt{}, nil
	pendingPool.Put(p)
}

type ctlOp int

const (
	opCheckpoint ctlOp = iota
	opClose
)

type ctlReq struct {
	op    ctlOp
	reply chan error
}

// Writer appends records to one epoch. It is safe for concurrent use.
// Every change of the log's state happens under one lock (cmu). An Append
// that finds that lock free and no record queued commits its own record
// (write, and in strict and group mode fdatasync) without a goroutine
// handoff; otherwise it queues the record for the committer goroutine,
// which writes and syncs whatever has queued as one batch (group commit)
// and also runs the checkpoint and sync timers, forced checkpoints and the
// seal.
type Writer struct {
	dir      string
	epochDir string
	epoch    int
	origin   string
	recovery *record.Recovery // what Open recovered from a crashed previous epoch
	vkey     string
	signer   note.Signer
	opts     Options
	lock     *os.File
	now      func() time.Time

	in   chan *pending
	ctl  chan ctlReq
	done chan struct{}

	mu     sync.RWMutex // held shared by senders; exclusively by Close
	closed bool

	// cmu serialises every change of the committer state below (commit,
	// checkpoint, sync, rotation, seal), whether the committer goroutine
	// or an appender makes it.
	cmu sync.Mutex
	// committerWaits is set while the committer goroutine holds a queued
	// record and waits for cmu: appenders then queue behind it rather
	// than take the lock first.
	committerWaits atomic.Bool
	// Appends committed by their caller and by the committer goroutine
	// (guarded by cmu; for tests).
	nInline, nQueued int64

	fatal atomic.Pointer[FatalError]

	secret     []byte
	keys       *keyDeriver
	nextCommit atomic.Int64
	recips     []age.Recipient
	vaultMu    sync.Mutex
	vaultBuf   []byte
	vaultF     *os.File
	vaultBytes int64 // size of the vault file (guarded by cmu)
	vaultDirty bool  // vault bytes written and not yet synced (guarded by cmu)

	// appendErrors counts failed appends (AppendErrors).
	appendErrors atomic.Uint64

	latestMu sync.Mutex
	latest   []byte

	// committer state, guarded by cmu
	f        *os.File
	segNo    int
	segBytes int64
	segHash  hash.Hash
	seq      int64
	prev     tlog.Hash
	fr       merkle.Frontier
	sinceCP  int64
	lastNote string
	buf      []byte
	tsBuf    []byte
	dirty    bool
	cpNotes  [][]byte

	// log tree (Options.Log), guarded by cmu
	logSigner note.Signer
	logVkey   string
	logBase   merkle.Frontier
	logFr     merkle.Frontier
	logLeaves []tlog.Hash     // leaves since the last log checkpoint made
	logCPs    []LogCheckpoint // made, not yet published
}

// Origin returns the epoch's origin (the checkpoint origin and key name).
func (w *Writer) Origin() string { return w.origin }

// Recovery returns what Open found of a previous epoch that was not sealed
// (the writer crashed or was killed) and what it cut from its tail, as
// written in this epoch's recovery record; nil when the previous epoch was
// sealed or there was none. The gateway logs it at start.
func (w *Writer) Recovery() *record.Recovery { return w.recovery }

// VerifierKey returns the note verifier key of the epoch's signing key
// ("origin+hash+base64"), the form `cmcp verify-chain --key` takes.
func (w *Writer) VerifierKey() string { return w.vkey }

// Epoch returns the epoch number and its directory.
func (w *Writer) Epoch() (int, string) { return w.epoch, w.epochDir }

// LatestCheckpoint returns the newest durable signed checkpoint note.
func (w *Writer) LatestCheckpoint() []byte {
	w.latestMu.Lock()
	defer w.latestMu.Unlock()
	return append([]byte(nil), w.latest...)
}

// Err returns the fatal error that stopped the writer, if any.
func (w *Writer) Err() error {
	if e := w.fatal.Load(); e != nil {
		return e
	}
	return nil
}

func (o *Options) setDefaults() error {
	if len(o.Key) != ed25519.PrivateKeySize {
		return errors.New("options: Key must be an Ed25519 private key")
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	if strings.ContainsAny(o.Name, " +\t\n") {
		return fmt.Errorf("options: name %q must not contain spaces or '+'", o.Name)
	}
	switch o.Durability {
	case "":
		o.Durability = record.DurabilityGroup
	case record.DurabilityStrict, record.DurabilityGroup, record.DurabilityInterval:
	default:
		return fmt.Errorf("options: durability %q: want strict, group or interval", o.Durability)
	}
	if o.SyncInterval <= 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.CheckpointEvery <= 0 {
		o.CheckpointEvery = DefaultCheckpointEvery
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = DefaultSegmentBytes
	}
	if o.Vault && len(o.Recipients) == 0 {
		return errors.New("options: the payload vault needs age recipients")
	}
	if o.Log != nil {
		if o.Log.Origin == "" || strings.ContainsAny(o.Log.Origin, " +\t\n") {
			return fmt.Errorf("options: log origin %q must be non-empty, without spaces or '+'", o.Log.Origin)
		}
		if len(o.Log.Key) != ed25519.PrivateKeySize {
			return errors.New("options: the log key must be an Ed25519 private key")
		}
	}
	return nil
}

// Open starts a new epoch in the audit directory dir (created if needed)
// and returns its Writer. If the previous epoch did not end with a seal
// (a crash), its incomplete tail is cut first and described in a recovery
// record; damage before its last checkpoint is refused as tampering.
func Open(dir string, opts Options) (*Writer, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	recips, err := ParseRecipients(opts.Recipients)
	if err != nil {
		return nil, fmt.Errorf("options: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create audit directory: %w", err)
	}
	lock, err := logdir.LockDir(dir)
	if err != nil {
		return nil, err
	}
	w := &Writer{dir: dir, opts: opts, lock: lock, now: time.Now, recips: recips}
	ok, created := false, false
	defer func() {
		if !ok {
			w.closeFiles()
			if created {
				w.removeEpoch()
			}
			lock.Close()
		}
	}()

	epochs, err := logdir.ListEpochs(dir)
	if err != nil {
		return nil, err
	}
	var pred *record.Predecessor
	var recov *record.Recovery
	if len(epochs) > 0 {
		pred, recov, err = recoverEpoch(dir, epochs[len(epochs)-1])
		if err != nil {
			return nil, err
		}
	}
	w.recovery = recov
	w.epoch = 1
	if pred != nil {
		w.epoch = pred.Epoch + 1
	}

	logInfo, err := w.newIdentity(pred)
	if err != nil {
		return nil, err
	}
	g, body, err := w.genesis(pred, logInfo, recips)
	if err != nil {
		return nil, err
	}
	if err := w.start(g, body, recov, &created); err != nil {
		return nil, err
	}
	w.in = make(chan *pending, maxBatch)
	w.ctl = make(chan ctlReq)
	w.done = make(chan struct{})
	go w.run()
	ok = true
	return w, nil
}

// newIdentity makes the new epoch's origin, key and commitment secret,
// and with a log identity (Options.Log) its place in the log tree, which
// the genesis records (the returned LogInfo; nil without one).
func (w *Writer) newIdentity(pred *record.Predecessor) (*record.LogInfo, error) {
	dir, opts := w.dir, w.opts
	var err error
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	name := logdir.EpochName(w.epoch)
	w.origin = opts.Name + "/" + name + "-" + hex.EncodeToString(rnd[:])
	w.signer, w.vkey, err = c2sp.NewNoteKeys(w.origin, opts.Key)
	if err != nil {
		return nil, err
	}
	w.secret = make([]byte, 32)
	if _, err := rand.Read(w.secret); err != nil {
		return nil, err
	}
	w.keys = newKeyDeriver(w.secret)
	var logInfo *record.LogInfo
	if opts.Log != nil {
		if w.logSigner, w.logVkey, err = c2sp.NewNoteKeys(opts.Log.Origin, opts.Log.Key); err != nil {
			return nil, fmt.Errorf("log key: %w", err)
		}
		if w.logBase, err = logBaseOf(dir, pred); err != nil {
			return nil, fmt.Errorf("the log tree of the earlier epochs: %w", err)
		}
		w.logFr = w.logBase.Clone()
		logInfo = &record.LogInfo{Origin: opts.Log.Origin, Key: w.logVkey, Size: w.logBase.N, Frontier: [][]byte{}}
		for _, h := range w.logBase.Hashes {
			logInfo.Frontier = append(logInfo.Frontier, append([]byte(nil), h[:]...))
		}
	}
	return logInfo, nil
}

// genesis builds the new epoch's genesis record and its body: its
// statement over the body, the attestation evidence of that statement
// (Options.Evidence), and the sealed commitment secret.
func (w *Writer) genesis(pred *record.Predecessor, logInfo *record.LogInfo, recips []age.Recipient) (*record.Genesis, []byte, error) {
	opts := w.opts
	var err error
	g := &record.Genesis{
		Origin:           w.origin,
		Epoch:            w.epoch,
		Key:              w.vkey,
		Created:          w.now().UTC(),
		Durability:       opts.Durability,
		CheckpointEvery:  opts.CheckpointEvery,
		CheckpointMillis: opts.CheckpointInterval.Milliseconds(),
		SegmentBytes:     opts.SegmentBytes,
		Gateway:          opts.Gateway,
		ConfigDigest:     opts.ConfigDigest,
		PolicyDigest:     opts.PolicyDigest,
		CatalogDigest:    opts.CatalogDigest,
		PolicyMode:       opts.PolicyMode,
		Commitments:      record.CommitmentInfo{Scheme: CommitmentScheme},
		Predecessor:      pred,
		Log:              logInfo,
		Extra:            opts.Extra,
	}
	if opts.Durability == record.DurabilityInterval {
		g.IntervalMillis = opts.SyncInterval.Milliseconds()
	}
	if len(recips) > 0 {
		g.Commitments.Recipients = opts.Recipients
		if g.Commitments.SealedSecret, err = sealSecret(w.secret, recips); err != nil {
			return nil, nil, fmt.Errorf("seal the commitment secret: %w", err)
		}
		if opts.Vault {
			g.Commitments.Vault = VaultFile
		}
	}
	body, err := record.EncodeBody(g)
	if err != nil {
		return nil, nil, err
	}
	if g.Statement, err = StatementOf(body); err != nil {
		return nil, nil, err
	}
	if opts.Evidence != nil {
		ev, err := opts.Evidence(g.Statement, opts.Key.Public().(ed25519.PublicKey))
		if err != nil {
			return nil, nil, fmt.Errorf("attestation evidence for the genesis record: %w", err)
		}
		g.Evidence = ev
	}
	if body, err = record.EncodeBody(g); err != nil {
		return nil, nil, err
	}
	return g, body, nil
}

// start creates the epoch directory (then *created is set: a failed Open
// removes it), its vault and first segment, and writes the genesis
// record, the recovery record if the previous epoch was recovered, and a
// checkpoint, durably.
func (w *Writer) start(g *record.Genesis, body []byte, recov *record.Recovery, created *bool) error {
	dir, opts, name := w.dir, w.opts, logdir.EpochName(w.epoch)
	var err error
	w.epochDir = filepath.Join(dir, name)
	if err := os.Mkdir(w.epochDir, 0o700); err != nil {
		return fmt.Errorf("create epoch directory: %w", err)
	}
	*created = true
	if err := logdir.SyncDir(dir); err != nil {
		return err
	}
	if opts.Vault {
		if w.vaultF, err = os.OpenFile(filepath.Join(w.epochDir, VaultFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600); err != nil {
			return fmt.Errorf("create payload vault: %w", err)
		}
	}
	if err := w.openSegment(1); err != nil {
		return err
	}
	ts := timestamp(g.Created)
	w.addLine(record.KindGenesis, body, ts)
	if recov != nil {
		rb, err := record.EncodeBody(recov)
		if err != nil {
			return err
		}
		w.addLine(record.KindRecovery, rb, timestamp(w.now()))
	}
	if err := w.addCheckpoint(); err != nil {
		return err
	}
	if err := w.flush(true); err != nil {
		return err
	}
	w.publish()

	return nil
}

func (w *Writer) openSegment(n int) error {
	p := filepath.Join(w.epochDir, logdir.SegmentName(n))
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("create segment: %w", err)
	}
	if err := logdir.SyncDir(w.epochDir); err != nil {
		f.Close()
		return err
	}
	w.f, w.segNo, w.segBytes, w.segHash = f, n, 0, sha256.New()
	return nil
}

// addLine appends one record to the pending buffer and advances the chain.
func (w *Writer) addLine(kind record.Kind, body []byte, ts string) Receipt {
	start := len(w.buf)
	w.buf = record.AppendLine(w.buf, kind, body, w.prev, w.seq, ts)
	h := tlog.RecordHash(w.buf[start:])
	w.buf = append(w.buf, '\n')
	r := Receipt{Epoch: w.epoch, Index: w.seq, Hash: h}
	w.fr.Append(h)
	if w.logSigner != nil {
		w.logFr.Append(h)
		w.logLeaves = append(w.logLeaves, h)
	}
	w.prev = h
	w.seq++
	w.sinceCP++
	return r
}

// addCheckpoint appends a signed checkpoint over every record so far.
func (w *Writer) addCheckpoint() error {
	text := c2sp.CheckpointBody(w.origin, w.fr.N, w.fr.Root())
	msg, err := note.Sign(&note.Note{Text: text}, w.signer)
	if err != nil {
		return fmt.Errorf("sign checkpoint: %w", err)
	}
	body, err := record.EncodeBody(&record.CheckpointRecord{Note: string(msg)})
	if err != nil {
		return err
	}
	w.addLine(record.KindCheckpoint, body, "")
	w.sinceCP = 0
	w.lastNote = string(msg)
	w.cpNotes = append(w.cpNotes, msg)
	if w.logSigner != nil {
		root := w.logFr.Root()
		lmsg, err := note.Sign(&note.Note{Text: c2sp.CheckpointBody(w.opts.Log.Origin, w.logFr.N, root)}, w.logSigner)
		if err != nil {
			return fmt.Errorf("sign log checkpoint: %w", err)
		}
		w.logCPs = append(w.logCPs, LogCheckpoint{Note: lmsg, Size: w.logFr.N, Root: root, Leaves: w.logLeaves})
		w.logLeaves = nil
	}
	return nil
}

// LogVerifierKey returns the note verifier key of the log key (empty
// without Options.Log).
func (w *Writer) LogVerifierKey() string { return w.logVkey }

// LogBase returns the log tree of the records of the epochs before this
// one: its size (the log index of this epoch's genesis) and compact range,
// to start a LogTree that LogCheckpoint.Leaves then extend.
func (w *Writer) LogBase() (int64, []tlog.Hash) {
	return w.logBase.N, append([]tlog.Hash(nil), w.logBase.Hashes...)
}

// flush writes the pending buffer (and the vault before it) in one write
// and, if sync, fdatasyncs both. If that fails, what it wrote is cut off
// again (cutBatch).
func (w *Writer) flush(sync bool) (err error) {
	// A checkpoint is published (OnCheckpoint, LatestCheckpoint) only once
	// durable, whatever the mode.
	sync = sync || len(w.cpNotes) > 0
	segStart, vaultStart := w.segBytes, w.vaultBytes
	defer func() {
		if err != nil {
			err = w.cutBatch(segStart, vaultStart, err)
		}
	}()
	if err := w.flushVault(sync); err != nil {
		return err
	}
	if len(w.buf) > 0 {
		n, err := w.f.Write(w.buf)
		w.segHash.Write(w.buf[:n])
		w.segBytes += int64(n)
		if err != nil {
			return fmt.Errorf("write %s: %w", w.f.Name(), err)
		}
		w.buf = w.buf[:0]
		w.dirty = true
	}
	if sync && w.dirty {
		if err := logdir.Fdatasync(w.f); err != nil {
			return fmt.Errorf("fdatasync %s: %w", w.f.Name(), err)
		}
		w.dirty = false
	}
	return nil
}

func (w *Writer) flushVault(sync bool) error {
	if w.vaultF == nil {
		return nil
	}
	w.vaultMu.Lock()
	b := w.vaultBuf
	w.vaultBuf = nil
	w.vaultMu.Unlock()
	if len(b) > 0 {
		n, err := w.vaultF.Write(b)
		w.vaultBytes += int64(n)
		w.vaultDirty = true
		if err != nil {
			return fmt.Errorf("write payload vault: %w", err)
		}
	}
	// Entries written by an earlier flush that did not sync (interval
	// mode) are synced with the first sync after them, before the segment
	// whose records refer to them: a record is never durable without its
	// entry.
	if sync && w.vaultDirty {
		if err := logdir.Fdatasync(w.vaultF); err != nil {
			return fmt.Errorf("fdatasync payload vault: %w", err)
		}
		w.vaultDirty = false
	}
	return nil
}

// publish makes the checkpoints written so far visible (after they are durable).
func (w *Writer) publish() {
	if len(w.cpNotes) == 0 && len(w.logCPs) == 0 {
		return
	}
	last := w.cpNotes[len(w.cpNotes)-1]
	w.latestMu.Lock()
	w.latest = last
	w.latestMu.Unlock()
	if w.opts.OnCheckpoint != nil {
		for _, n := range w.cpNotes {
			w.opts.OnCheckpoint(n)
		}
	}
	w.cpNotes = w.cpNotes[:0]
	if w.opts.Log != nil && w.opts.Log.OnCheckpoint != nil {
		for _, c := range w.logCPs {
			w.opts.Log.OnCheckpoint(c)
		}
	}
	w.logCPs = w.logCPs[:0]
}

func (w *Writer) setFatal(err error) *FatalError {
	fe := &FatalError{Err: err}
	if w.fatal.CompareAndSwap(nil, fe) {
		return fe
	}
	return w.fatal.Load()
}

// Append writes rec and returns once it is durable (strict, group) or
// written to the file (interval). Kinds the writer owns (genesis, segment,
// checkpoint, recovery, seal) are refused. ctx bounds only the wait for a
// place in the committer's queue: if it ends then, Append returns ctx.Err()
// and the record is not written. Once the record is queued (or committed
// by Append itself, the log being idle), Append waits for its outcome, so
// that an error always means the record was not written.
func (w *Writer) Append(ctx context.Context, rec record.Record) (Receipt, error) {
	r, err := w.appendOne(ctx, rec)
	if err != nil && (ctx.Err() == nil || err != ctx.Err()) {
		w.appendErrors.Add(1)
	}
	return r, err
}

func (w *Writer) appendOne(ctx context.Context, rec record.Record) (Receipt, error) {
	if rec == nil {
		return Receipt{}, errors.New("append: nil record")
	}
	k := rec.Kind()
	if record.IsWriterKind(k) {
		return Receipt{}, fmt.Errorf("append: %s records are written by the log itself", k)
	}
	if fe := w.fatal.Load(); fe != nil {
		return Receipt{}, fe
	}
	if err := ctx.Err(); err != nil {
		return Receipt{}, err
	}
	p := pendingPool.Get().(*pending)
	body, err := record.AppendBody(p.body[:0], rec)
	if err != nil {
		putPending(p)
		return Receipt{}, err
	}
	p.kind, p.body = k, body
	if len(body) > record.MaxRecordBytes-256 {
		putPending(p)
		return Receipt{}, fmt.Errorf("append: %s record is %d bytes, the limit is %d", k, len(body), record.MaxRecordBytes-256)
	}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		putPending(p)
		return Receipt{}, ErrClosed
	}
	// Caller commits: with nobody committing and nothing queued (in the
	// channel or in the committer's hands), write (and sync) the record
	// here rather than hand it to the committer and wait for its answer.
	// The lock is taken before the read lock is let go, so the seal (which
	// Close asks for only once no appender holds the read lock) cannot come
	// first; records queued meanwhile wait for the lock in the committer.
	if len(w.in) == 0 && !w.committerWaits.Load() && w.cmu.TryLock() {
		if len(w.in) == 0 {
			w.mu.RUnlock()
			batch := [1]*pending{p}
			w.commit(batch[:])
			w.nInline++
			w.cmu.Unlock()
			<-p.done // commit has answered: never blocks
			res, err := p.res, p.err
			putPending(p)
			return res, err
		}
		w.cmu.Unlock()
	}
	select {
	case w.in <- p:
	case <-ctx.Done():
		w.mu.RUnlock()
		putPending(p)
		return Receipt{}, ctx.Err()
	}
	w.mu.RUnlock()
	<-p.done // the committer answers every record it takes, written or failed
	res, err := p.res, p.err
	putPending(p)
	return res, err
}

// Commit returns a commitment to payload (the exact wire bytes) under a
// fresh per-commitment key. With a vault, the payload is also sealed with
// age to the recipients and written to the vault before any record that
// is appended after this call becomes durable.
func (w *Writer) Commit(payload []byte) record.Commitment {
	id := w.nextCommit.Add(1) - 1
	c := w.keys.commitment(id, payload)
	if w.vaultF != nil {
		ct, err := sealSecret(payload, w.recips)
		if err != nil {
			w.setFatal(fmt.Errorf("seal payload %d for the vault: %w", id, err))
			return c
		}
		line, err := jsonv2.Marshal(vaultLine{ID: id, Age: ct})
		if err != nil {
			w.setFatal(fmt.Errorf("encode vault line: %w", err))
			return c
		}
		w.vaultMu.Lock()
		w.vaultBuf = append(append(w.vaultBuf, line...), '\n')
		w.vaultMu.Unlock()
	}
	return c
}

// Checkpoint writes a signed checkpoint over every record appended so far
// (if there is any since the last one) and makes it durable.
func (w *Writer) Checkpoint() error {
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return ErrClosed
	}
	reply := make(chan error, 1)
	w.ctl <- ctlReq{op: opCheckpoint, reply: reply}
	w.mu.RUnlock()
	return <-reply
}

// Close drains pending appends, writes a seal record and a final
// checkpoint, syncs and closes the epoch. It returns the fatal error if the
// writer had one.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	w.closed = true
	w.mu.Unlock()
	reply := make(chan error, 1)
	w.ctl <- ctlReq{op: opClose, reply: reply}
	err := <-reply
	<-w.done
	w.lock.Close()
	return err
}

func (w *Writer) run() {
	defer close(w.done)
	cpTick := time.NewTicker(w.opts.CheckpointInterval)
	defer cpTick.Stop()
	var syncC <-chan time.Time
	if w.opts.Durability == record.DurabilityInterval {
		t := time.NewTicker(w.opts.SyncInterval)
		defer t.Stop()
		syncC = t.C
	}
	batch := make([]*pending, 0, 64)
	for {
		select {
		case p := <-w.in:
			w.committerWaits.Store(true)
			w.cmu.Lock()
			w.committerWaits.Store(false)
			batch = append(batch[:0], p)
			if w.opts.Durability != record.DurabilityStrict {
				batch = w.drain(batch) // what queued while the lock was busy too
			}
			w.commit(batch)
			w.nQueued += int64(len(batch))
			w.cmu.Unlock()
			clear(batch) // the appenders recycle their pendings
		case <-cpTick.C:
			w.cmu.Lock()
			if w.sinceCP > 0 && w.fatal.Load() == nil {
				if w.guard(func() error {
					if err := w.addCheckpoint(); err != nil {
						return err
					}
					return w.flush(w.opts.Durability != record.DurabilityInterval)
				}) == nil {
					w.maybeRotate()
				}
			}
			w.cmu.Unlock()
		case <-syncC:
			w.cmu.Lock()
			if w.fatal.Load() == nil && (w.dirty || w.vaultDirty || w.vaultPending()) {
				w.guard(func() error { return w.flush(true) })
			}
			w.cmu.Unlock()
		case c := <-w.ctl:
			w.cmu.Lock()
			switch c.op {
			case opCheckpoint:
				err := w.forcedCheckpoint()
				w.cmu.Unlock()
				c.reply <- err
			case opClose:
				for {
					batch = w.drain(batch[:0])
					if len(batch) == 0 {
						break
					}
					w.commit(batch)
					w.nQueued += int64(len(batch))
				}
				err := w.seal()
				w.cmu.Unlock()
				c.reply <- err
				return
			}
		}
	}
}

// drain adds queued appends to batch without blocking.
func (w *Writer) drain(batch []*pending) []*pending {
	for len(batch) < maxBatch {
		select {
		case p := <-w.in:
			batch = append(batch, p)
		default:
			return batch
		}
	}
	return batch
}

func (w *Writer) vaultPending() bool {
	w.vaultMu.Lock()
	defer w.vaultMu.Unlock()
	return len(w.vaultBuf) > 0
}

// guard runs fn and turns its error into the fatal error.
func (w *Writer) guard(fn func() error) error {
	if fe := w.fatal.Load(); fe != nil {
		return fe
	}
	if err := fn(); err != nil {
		return w.setFatal(err)
	}
	w.publish()
	return nil
}

func (w *Writer) forcedCheckpoint() error {
	return w.guard(func() error {
		if w.sinceCP > 0 {
			if err := w.addCheckpoint(); err != nil {
				return err
			}
		}
		return w.flush(true)
	})
}

// timestamp formats t as the "ts" member: RFC 3339, UTC, nanoseconds.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func (w *Writer) commit(batch []*pending) {
	if fe := w.fatal.Load(); fe != nil {
		for _, p := range batch {
			p.err = fe
			p.done <- struct{}{}
		}
		return
	}
	now := w.now()
	w.tsBuf = now.UTC().AppendFormat(w.tsBuf[:0], time.RFC3339Nano) // timestamp(now) without a string per batch
	// A view of tsBuf, not a copy: tsBuf is not touched again until the next batch.
	ts := unsafe.String(unsafe.SliceData(w.tsBuf), len(w.tsBuf))
	for _, p := range batch {
		p.res = w.addLine(p.kind, p.body, ts)
		p.res.Time = now
	}
	durable := w.opts.Durability != record.DurabilityInterval
	err := w.guard(func() error {
		if w.sinceCP >= w.opts.CheckpointEvery {
			if err := w.addCheckpoint(); err != nil {
				return err
			}
		}
		return w.flush(durable)
	})
	for _, p := range batch {
		if err != nil {
			p.err = err
			p.res = Receipt{}
		} else {
			p.res.Durable = durable
		}
		p.done <- struct{}{} // the last use of p: its Append may recycle it
	}
	if err == nil {
		w.maybeRotate()
	}
}

// maybeRotate closes the segment with a checkpoint and starts the next one
// with a segment record once the segment is large enough.
func (w *Writer) maybeRotate() error {
	if w.segBytes < w.opts.SegmentBytes {
		return nil
	}
	err := func() error {
		if w.sinceCP > 0 {
			if err := w.addCheckpoint(); err != nil {
				return err
			}
		}
		if err := w.flush(true); err != nil {
			return err
		}
		prevName := filepath.Base(w.f.Name())
		prevSum := w.segHash.Sum(nil)
		if err := w.f.Close(); err != nil {
			return fmt.Errorf("close %s: %w", prevName, err)
		}
		if err := w.openSegment(w.segNo + 1); err != nil {
			return err
		}
		fr := make([][]byte, len(w.fr.Hashes))
		for i, h := range w.fr.Hashes {
			fr[i] = append([]byte(nil), h[:]...)
		}
		body, err := record.EncodeBody(&record.Segment{Number: w.segNo, FirstIndex: w.seq, PrevFile: prevName, PrevSHA256: prevSum, Checkpoint: w.lastNote, Frontier: fr})
		if err != nil {
			return err
		}
		w.addLine(record.KindSegment, body, timestamp(w.now()))
		return w.flush(true)
	}()
	if err != nil {
		return w.setFatal(err)
	}
	w.publish()
	return nil
}

func (w *Writer) seal() error {
	if fe := w.fatal.Load(); fe != nil {
		w.closeFiles()
		return fe
	}
	err := func() error {
		body, err := record.EncodeBody(&record.Seal{Reason: "close", Records: w.seq})
		if err != nil {
			return err
		}
		w.addLine(record.KindSeal, body, timestamp(w.now()))
		if err := w.addCheckpoint(); err != nil {
			return err
		}
		if err := w.flush(true); err != nil {
			return err
		}
		return nil
	}()
	if err != nil {
		fe := w.setFatal(err)
		w.closeFiles()
		return fe
	}
	w.publish()
	if err := w.closeFiles(); err != nil {
		return err
	}
	return logdir.SyncDir(w.epochDir)
}

func (w *Writer) closeFiles() error {
	var first error
	if w.f != nil {
		if err := w.f.Close(); err != nil && first == nil {
			first = err
		}
		w.f = nil
	}
	if w.vaultF != nil {
		if err := w.vaultF.Close(); err != nil && first == nil {
			first = err
		}
		w.vaultF = nil
	}
	return first
}
