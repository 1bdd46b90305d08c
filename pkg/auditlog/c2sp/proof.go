package c2sp

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/tlog"
)

// ProofHeader is the first line of an offline proof (c2sp.org/tlog-proof@v1).
const ProofHeader = "c2sp.org/tlog-proof@v1"

// MaxProofBytes bounds the size of a proof ParseProof reads: twice
// record.MaxLineBytes, for a record line and the checkpoint.
const MaxProofBytes = 8 << 20

// maxProofHashes bounds the inclusion proof length (a tree of 2^63 leaves).
const maxProofHashes = 63

// Proof is a parsed offline proof for one record.
type Proof struct {
	Record     []byte // the record line (the "extra" data)
	Index      int64
	Hashes     tlog.RecordProof
	Checkpoint []byte // the signed note, verbatim
}

// Format encodes p as a c2sp.org/tlog-proof@v1 text.
func (p *Proof) Format() []byte {
	var b bytes.Buffer
	b.WriteString(ProofHeader + "\n")
	b.WriteString("extra " + base64.StdEncoding.EncodeToString(p.Record) + "\n")
	fmt.Fprintf(&b, "index %d\n", p.Index)
	for _, h := range p.Hashes {
		b.WriteString(base64.StdEncoding.EncodeToString(h[:]) + "\n")
	}
	b.WriteString("\n")
	b.Write(p.Checkpoint)
	return b.Bytes()
}

// ErrMalformedProof is returned (wrapped) by ParseProof.
var ErrMalformedProof = errors.New("malformed proof")

// ParseProof parses a c2sp.org/tlog-proof@v1 text with the record in its
// extra line. It does not verify anything.
func ParseProof(text []byte) (*Proof, error) {
	if len(text) > MaxProofBytes {
		return nil, fmt.Errorf("%w: %d bytes is too large", ErrMalformedProof, len(text))
	}
	head, cp, ok := bytes.Cut(text, []byte("\n\n"))
	if !ok {
		return nil, fmt.Errorf("%w: no blank line before the checkpoint", ErrMalformedProof)
	}
	lines := strings.Split(string(head), "\n")
	if lines[0] != ProofHeader {
		return nil, fmt.Errorf("%w: first line %q, want %q", ErrMalformedProof, clip(lines[0]), ProofHeader)
	}
	p := &Proof{Checkpoint: cp}
	k := 1
	if k < len(lines) && strings.HasPrefix(lines[k], "extra ") {
		rec, err := base64.StdEncoding.Strict().DecodeString(lines[k][len("extra "):])
		if err != nil {
			return nil, fmt.Errorf("%w: extra line: %v", ErrMalformedProof, err)
		}
		p.Record = rec
		k++
	}
	if k >= len(lines) {
		return nil, fmt.Errorf("%w: no index line", ErrMalformedProof)
	}
	is, ok := strings.CutPrefix(lines[k], "index ")
	idx, err := strconv.ParseInt(is, 10, 64)
	if !ok || err != nil || idx < 0 || strconv.FormatInt(idx, 10) != is {
		return nil, fmt.Errorf("%w: line %d: want \"index N\"", ErrMalformedProof, k+1)
	}
	p.Index = idx
	for i, l := range lines[k+1:] {
		if len(p.Hashes) >= maxProofHashes {
			return nil, fmt.Errorf("%w: more than %d hashes", ErrMalformedProof, maxProofHashes)
		}
		hb, err := base64.StdEncoding.Strict().DecodeString(l)
		if err != nil || len(hb) != tlog.HashSize {
			return nil, fmt.Errorf("%w: line %d is not a base64 SHA-256 hash", ErrMalformedProof, k+2+i)
		}
		p.Hashes = append(p.Hashes, tlog.Hash(hb))
	}
	if p.Record == nil {
		return nil, fmt.Errorf("%w: no extra line with the record (cmcp proofs carry the record)", ErrMalformedProof)
	}
	if _, err := ParseCheckpoint(cp); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedProof, err)
	}
	return p, nil
}
