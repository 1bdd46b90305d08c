package auditlog

import (
	"bufio"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/merkle"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"golang.org/x/mod/sumdb/tlog"
)

// LogIdentity is a gateway's stable log identity: one origin and one
// Ed25519 key for every epoch, so that a witness can follow the gateway
// across restarts (FORMAT.md section 11). The epochs' own keys still sign
// the epochs' checkpoints; the log key signs log checkpoints over the log
// tree, whose leaves are the records of every epoch in order.
type LogIdentity struct {
	// Origin is the log checkpoint origin and the log key's note name,
	// e.g. "example.com/gw1". It must not contain spaces or '+'.
	Origin string
	// Key signs the log checkpoints. Keep it across restarts
	// (LoadOrCreateLogKey), outside the audit directory.
	Key ed25519.PrivateKey
	// OnCheckpoint, if set, is called (with the writer's lock held: keep it
	// short, never call the Writer from it) with each log checkpoint once
	// the epoch checkpoint record it follows is durable.
	OnCheckpoint func(LogCheckpoint)
}

// LogCheckpoint is a signed checkpoint of the log tree.
type LogCheckpoint struct {
	Note []byte    // C2SP signed note, signed by the log key
	Size int64     // log tree size: every record of every epoch so far
	Root tlog.Hash // log tree root
	// Leaves are the leaf hashes of log entries [Size-len(Leaves), Size):
	// the records since the previous log checkpoint of this writer (for the
	// first one, since the epoch's base), so that a LogTree can follow.
	Leaves []tlog.Hash
}

// nodesOf returns the compact range [0, n) as (lo, hi) pairs, largest first.
func nodesOf(n int64) [][2]int64 {
	var out [][2]int64
	var lo int64
	for k := 62; k >= 0; k-- {
		if n>>k&1 == 1 {
			out = append(out, [2]int64{lo, lo + 1<<k})
			lo += 1 << k
		}
	}
	return out
}

// LogTree follows the log tree in memory from a floor (a compact range of
// its first entries) and proves consistency between two of its sizes, as a
// witness client must (c2sp.org/tlog-witness). Proofs from a size below
// the floor read the log's records from the audit directory.
type LogTree struct {
	dir    string
	floor  merkle.Frontier
	leaves []tlog.Hash // entries [floor.n, floor.n+len(leaves))
}

// NewLogTree starts a log tree of the audit directory dir at size base with
// the compact range hashes of [0, base) (Writer.LogBase).
func NewLogTree(dir string, base int64, hashes []tlog.Hash) (*LogTree, error) {
	var hs [][]byte
	for _, h := range hashes {
		hs = append(hs, h[:])
	}
	f, err := merkle.FrontierFrom(base, hs)
	if err != nil {
		return nil, err
	}
	return &LogTree{dir: dir, floor: f}, nil
}

// Size is the number of entries the tree holds.
func (t *LogTree) Size() int64 { return t.floor.N + int64(len(t.leaves)) }

// Append adds entries at the end.
func (t *LogTree) Append(leaves ...tlog.Hash) { t.leaves = append(t.leaves, leaves...) }

// Floor is the size below which proofs need the records on disk.
func (t *LogTree) Floor() int64 { return t.floor.N }

// Trim forgets the entries before size to (it becomes the floor): proofs
// from sizes at or above it stay in memory.
func (t *LogTree) Trim(to int64) {
	if to <= t.floor.N || to > t.Size() {
		return
	}
	k := to - t.floor.N
	for _, h := range t.leaves[:k] {
		t.floor.Append(h)
	}
	t.leaves = append([]tlog.Hash(nil), t.leaves[k:]...)
}

// Root returns the root of the first n entries (floor <= n <= Size).
func (t *LogTree) Root(n int64) (tlog.Hash, error) {
	if n < t.floor.N || n > t.Size() {
		return tlog.Hash{}, fmt.Errorf("log tree root at %d: outside [%d, %d]", n, t.floor.N, t.Size())
	}
	f := t.floor.Clone()
	for _, h := range t.leaves[:n-t.floor.N] {
		f.Append(h)
	}
	return f.Root(), nil
}

// node returns the hash of the perfect subtree over entries [lo, hi).
func (t *LogTree) node(lo, hi int64) (tlog.Hash, error) {
	fl := t.floor.N
	switch {
	case hi <= fl:
		for i, nd := range nodesOf(fl) {
			if nd[0] == lo && nd[1] == hi {
				return t.floor.Hashes[i], nil
			}
		}
		return tlog.Hash{}, fmt.Errorf("log tree node [%d, %d) lies before the floor %d", lo, hi, fl)
	case lo >= fl:
		if hi-fl > int64(len(t.leaves)) {
			return tlog.Hash{}, fmt.Errorf("log tree node [%d, %d) lies beyond the tree's %d entries", lo, hi, t.Size())
		}
		return subtree(t.leaves[lo-fl : hi-fl]), nil
	}
	mid := lo + (hi-lo)/2
	l, err := t.node(lo, mid)
	if err != nil {
		return tlog.Hash{}, err
	}
	r, err := t.node(mid, hi)
	if err != nil {
		return tlog.Hash{}, err
	}
	return tlog.NodeHash(l, r), nil
}

func subtree(ls []tlog.Hash) tlog.Hash {
	if len(ls) == 1 {
		return ls[0]
	}
	m := len(ls) / 2
	return tlog.NodeHash(subtree(ls[:m]), subtree(ls[m:]))
}

type nodeReader struct{ t *LogTree }

func (r nodeReader) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		level, n := tlog.SplitStoredHashIndex(x)
		lo := n << level
		h, err := r.t.node(lo, lo+1<<level)
		if err != nil {
			return nil, err
		}
		out[i] = h
	}
	return out, nil
}

// Prove returns the RFC 6962 consistency proof from size old to size n
// (0 < old <= n <= Size). Below the floor it reads the log tree's entries
// from the audit directory.
func (t *LogTree) Prove(old, n int64) (tlog.TreeProof, error) {
	if old <= 0 || old > n || n > t.Size() {
		return nil, fmt.Errorf("log tree consistency proof %d -> %d: needs 0 < old <= new <= %d", old, n, t.Size())
	}
	if old >= t.floor.N {
		return tlog.ProveTree(n, old, nodeReader{t})
	}
	leaves, err := ReadLogLeaves(t.dir, t.floor.N)
	if err != nil {
		return nil, fmt.Errorf("log tree consistency proof from %d (before the floor %d): %w", old, t.floor.N, err)
	}
	full := &LogTree{dir: t.dir, leaves: append(leaves, t.leaves...)}
	return tlog.ProveTree(n, old, nodeReader{full})
}

// ReadLogLeaves returns the leaf hashes of the first n entries of the log
// tree of the audit directory dir: the records of its epochs in order. It
// does not verify the log (Verify does); it reads what is on disk.
func ReadLogLeaves(dir string, n int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, 0, n)
	epochs, err := logdir.ListEpochs(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range epochs {
		ed := filepath.Join(dir, logdir.EpochName(e))
		segs, err := logdir.ListSegments(ed)
		if err != nil {
			return nil, err
		}
		for _, s := range segs {
			if int64(len(out)) == n {
				return out, nil
			}
			f, err := os.Open(filepath.Join(ed, logdir.SegmentName(s)))
			if err != nil {
				return nil, err
			}
			br := bufio.NewReaderSize(f, 1<<20)
			for int64(len(out)) < n {
				line, err := br.ReadBytes('\n')
				if err == io.EOF {
					break // an incomplete last line is no record
				}
				if err != nil {
					f.Close()
					return nil, err
				}
				out = append(out, tlog.RecordHash(line[:len(line)-1]))
			}
			f.Close()
		}
	}
	if int64(len(out)) < n {
		return nil, fmt.Errorf("the log holds %d records, fewer than the %d asked for", len(out), n)
	}
	return out, nil
}

// Cosigned log checkpoints (witness.jsonl).

// WitnessFile is the file in an epoch directory that keeps the log
// checkpoints with the witnesses' cosignatures (FORMAT.md section 11). It is
// not part of the tree: cosignatures authenticate themselves.
const WitnessFile = logdir.WitnessFile

// CosignedLine is one line of witness.jsonl.
type CosignedLine = logdir.CosignedLine

// AppendCosigned appends a cosigned log checkpoint to the epoch directory's
// witness.jsonl and syncs it.
func AppendCosigned(epochDir string, signed []byte) error {
	raw, err := jsonv2.Marshal(&CosignedLine{Note: string(signed)}, jsonv2.Deterministic(true))
	if err != nil {
		return fmt.Errorf("encode a %s line: %w", WitnessFile, err)
	}
	body := jsontext.Value(raw)
	if err := body.Canonicalize(); err != nil {
		return fmt.Errorf("encode a %s line: %w", WitnessFile, err)
	}
	f, err := os.OpenFile(filepath.Join(epochDir, WitnessFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", WitnessFile, err)
	}
	_, werr := f.Write(append(body, '\n'))
	if err := errors.Join(werr, logdir.Fdatasync(f), f.Close()); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(epochDir, WitnessFile), err)
	}
	return nil
}

// logBaseOf returns the log tree of every record before the new epoch:
// the previous epoch's genesis gives the tree before it (or, when it has no
// log member, the epochs before it are read), and the previous epoch's
// records, as recovery left them (pred.Size), are folded in.
func logBaseOf(dir string, pred *record.Predecessor) (merkle.Frontier, error) {
	if pred == nil {
		return merkle.Frontier{}, nil
	}
	g, err := readGenesis(dir, pred.Epoch)
	if err != nil {
		return merkle.Frontier{}, err
	}
	var f merkle.Frontier
	var epochs []int
	if g.Log != nil {
		if f, err = merkle.FrontierFrom(g.Log.Size, g.Log.Frontier); err != nil {
			return merkle.Frontier{}, fmt.Errorf("epoch %d's genesis: log frontier: %w", pred.Epoch, err)
		}
		epochs = []int{pred.Epoch}
	} else {
		all, err := logdir.ListEpochs(dir)
		if err != nil {
			return merkle.Frontier{}, err
		}
		for _, e := range all {
			if e <= pred.Epoch {
				epochs = append(epochs, e)
			}
		}
	}
	for _, e := range epochs {
		limit := int64(-1)
		if e == pred.Epoch {
			limit = pred.Size
		}
		n, err := foldEpochLeaves(filepath.Join(dir, logdir.EpochName(e)), limit, &f)
		if err != nil {
			return merkle.Frontier{}, err
		}
		if limit >= 0 && n != limit {
			return merkle.Frontier{}, fmt.Errorf("epoch %d holds %d records, recovery found %d", e, n, limit)
		}
	}
	return f, nil
}

// foldEpochLeaves appends the leaf hashes of an epoch's records (at most
// limit of them, unless limit < 0) to f and returns how many.
func foldEpochLeaves(edir string, limit int64, f *merkle.Frontier) (int64, error) {
	segs, err := logdir.ListSegments(edir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, s := range segs {
		fh, err := os.Open(filepath.Join(edir, logdir.SegmentName(s)))
		if err != nil {
			return n, err
		}
		br := bufio.NewReaderSize(fh, 1<<20)
		for limit < 0 || n < limit {
			line, err := br.ReadBytes('\n')
			if err == io.EOF {
				break
			}
			if err != nil {
				fh.Close()
				return n, err
			}
			f.Append(tlog.RecordHash(line[:len(line)-1]))
			n++
		}
		fh.Close()
	}
	return n, nil
}

// readGenesis decodes the genesis record of an epoch.
func readGenesis(dir string, epoch int) (*record.Genesis, error) {
	fh, err := os.Open(filepath.Join(dir, logdir.EpochName(epoch), logdir.SegmentName(1)))
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	line, err := bufio.NewReaderSize(fh, 64<<10).ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("epoch %d: read the genesis record: %w", epoch, err)
	}
	e, err := record.ParseLine(line[:len(line)-1])
	if err != nil {
		return nil, fmt.Errorf("epoch %d: genesis record: %w", epoch, err)
	}
	r, err := record.DecodeBody(record.KindGenesis, e.Body)
	if err != nil {
		return nil, fmt.Errorf("epoch %d: %w", epoch, err)
	}
	g, ok := r.(*record.Genesis)
	if !ok || e.Kind != record.KindGenesis {
		return nil, fmt.Errorf("epoch %d: the first record is not a genesis record", epoch)
	}
	return g, nil
}
