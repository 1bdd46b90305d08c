package auditlog

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding"
	"errors"
	"fmt"
	"hash"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/ageid"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	jsonv2 "github.com/go-json-experiment/json"
)

// CommitmentScheme names the commitment construction in the genesis record.
const CommitmentScheme = "hmac-sha256/v1"

// VaultFile is the name of the payload vault in an epoch directory.
const VaultFile = logdir.VaultFile

// Labels of the two HMACs (FORMAT.md §6), each with its 0x00 separator.
var (
	commitKeyLabel = []byte("cmcp/audit/commit-key/v1\x00")
	payloadLabel   = []byte("cmcp/audit/payload/v1\x00")
)

// commitKey derives the per-commitment key k_id from the epoch secret:
// HMAC-SHA256(secret, "cmcp/audit/commit-key/v1\x00" || decimal id).
func commitKey(secret []byte, id int64) []byte {
	m := getMAC()
	defer macPool.Put(m)
	return m.mac(make([]byte, 0, sha256.Size), secret, commitKeyLabel, strconv.AppendInt(m.msg[:0], id, 10))
}

// commitMAC computes HMAC-SHA256(k, "cmcp/audit/payload/v1\x00" || payload).
func commitMAC(key, payload []byte) []byte {
	m := getMAC()
	defer macPool.Put(m)
	return m.mac(make([]byte, 0, sha256.Size), key, payloadLabel, payload)
}

// hmacSHA256 computes HMAC-SHA256 (RFC 2104) like crypto/hmac, reusing its
// SHA-256 state instead of allocating two per MAC (commitments are made
// twice per gateway call). TestHMACSHA256 checks it against crypto/hmac.
// It is not safe for concurrent use; macPool hands them out.
type hmacSHA256 struct {
	h     hash.Hash
	inner [sha256.Size]byte
	pad   [sha256.BlockSize]byte
	key   [sha256.Size]byte // a derived commitment key
	msg   [48]byte          // the key derivation's message
}

var macPool = sync.Pool{New: func() any { return &hmacSHA256{h: sha256.New()} }}

func getMAC() *hmacSHA256 { return macPool.Get().(*hmacSHA256) }

// mac appends HMAC-SHA256(key, label || msg) to dst.
func (m *hmacSHA256) mac(dst, key, label, msg []byte) []byte {
	var hk [sha256.Size]byte
	if len(key) > sha256.BlockSize {
		hk = sha256.Sum256(key)
		key = hk[:]
	}
	m.setPad(key, 0x36)
	m.h.Reset()
	m.h.Write(m.pad[:])
	m.h.Write(label)
	m.h.Write(msg)
	inner := m.h.Sum(m.inner[:0])
	m.setPad(key, 0x5c)
	m.h.Reset()
	m.h.Write(m.pad[:])
	m.h.Write(inner)
	clear(m.pad[:])
	return m.h.Sum(dst)
}

// setPad sets pad to key, zero-padded to the block size, XOR b.
func (m *hmacSHA256) setPad(key []byte, b byte) {
	for i := range m.pad {
		m.pad[i] = b
	}
	for i, c := range key {
		m.pad[i] ^= c
	}
}

// keyDeriver derives commitment keys from one epoch secret with the
// secret's padded key blocks hashed once (as crypto/hmac does on Reset):
// each key costs two SHA-256 blocks instead of four. It is safe for
// concurrent use.
type keyDeriver struct {
	secret       []byte
	inner, outer []byte // SHA-256 states after (secret ^ ipad), (secret ^ opad); nil: not available
}

func newKeyDeriver(secret []byte) *keyDeriver {
	d := &keyDeriver{secret: secret}
	if len(secret) > sha256.BlockSize {
		return d
	}
	m := &hmacSHA256{h: sha256.New()}
	bm, ok := m.h.(encoding.BinaryMarshaler)
	if !ok {
		return d
	}
	m.setPad(secret, 0x36)
	m.h.Write(m.pad[:])
	inner, err := bm.MarshalBinary()
	if err != nil {
		return d
	}
	m.setPad(secret, 0x5c)
	m.h.Reset()
	m.h.Write(m.pad[:])
	outer, err := bm.MarshalBinary()
	clear(m.pad[:])
	if err != nil {
		return d
	}
	d.inner, d.outer = inner, outer
	return d
}

// deriveKey sets m.key to k_id = HMAC-SHA256(secret,
// "cmcp/audit/commit-key/v1\x00" || decimal id).
func (m *hmacSHA256) deriveKey(d *keyDeriver, id int64) {
	msg := strconv.AppendInt(append(m.msg[:0], commitKeyLabel...), id, 10)
	if u, ok := m.h.(encoding.BinaryUnmarshaler); ok && d.inner != nil && u.UnmarshalBinary(d.inner) == nil {
		m.h.Write(msg)
		inner := m.h.Sum(m.inner[:0])
		if u.UnmarshalBinary(d.outer) == nil {
			m.h.Write(inner)
			m.h.Sum(m.key[:0])
			return
		}
	}
	m.mac(m.key[:0], d.secret, nil, msg)
}

// commitment returns the commitment to payload under k_id.
func (d *keyDeriver) commitment(id int64, payload []byte) record.Commitment {
	m := getMAC()
	m.deriveKey(d, id)
	mac := m.mac(make([]byte, 0, sha256.Size), m.key[:], payloadLabel, payload)
	clear(m.key[:])
	macPool.Put(m)
	return record.Commitment{ID: id, Size: int64(len(payload)), MAC: mac}
}

// CheckCommitment reports whether payload matches c under the commitment
// key k (from Opener.Key). The comparison is constant-time.
func CheckCommitment(key []byte, c record.Commitment, payload []byte) bool {
	if c.IsZero() || int64(len(payload)) != c.Size {
		return false
	}
	return hmac.Equal(commitMAC(key, payload), c.MAC)
}

// sealSecret encrypts the epoch secret to the age recipients.
func sealSecret(secret []byte, rs []age.Recipient) ([]byte, error) {
	var b bytes.Buffer
	w, err := age.Encrypt(&b, rs...)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(secret); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Opener opens the payload commitments of one epoch with an auditor's age
// identity: it holds the epoch secret.
type Opener struct {
	secret []byte
	vault  map[int64][]byte // age ciphertexts, decrypted by Payload
	ids    []age.Identity
	torn   int64 // length of the vault's incomplete final line, if any
}

// NewOpener decrypts the epoch commitment secret sealed in g with one of the
// identities.
func NewOpener(g *record.Genesis, ids ...age.Identity) (*Opener, error) {
	if len(g.Commitments.SealedSecret) == 0 {
		return nil, fmt.Errorf("epoch %d has no sealed commitment secret: it was written without age recipients, so its commitments cannot be opened", g.Epoch)
	}
	r, err := age.Decrypt(bytes.NewReader(g.Commitments.SealedSecret), ids...)
	if err != nil {
		return nil, fmt.Errorf("open the commitment secret of epoch %d: %w", g.Epoch, err)
	}
	s, err := io.ReadAll(io.LimitReader(r, 1024))
	if err != nil {
		return nil, fmt.Errorf("open the commitment secret of epoch %d: %w", g.Epoch, err)
	}
	if len(s) != 32 {
		return nil, fmt.Errorf("commitment secret of epoch %d is %d bytes, want 32", g.Epoch, len(s))
	}
	return &Opener{secret: s}, nil
}

// Key returns the key of commitment id. Handing it to someone opens exactly
// that one commitment.
func (o *Opener) Key(id int64) []byte { return commitKey(o.secret, id) }

// Check reports whether payload is what c commits to.
func (o *Opener) Check(c record.Commitment, payload []byte) bool {
	return CheckCommitment(o.Key(c.ID), c, payload)
}

// vaultLine is one line of the vault: a payload encrypted with age.
type vaultLine struct {
	ID  int64  `json:"id,string"`
	Age []byte `json:"age"`
}

// ErrNoPayload is returned by Payload when the vault does not hold it.
var ErrNoPayload = errors.New("payload not in the vault")

// ErrPayloadMismatch is returned by Payload when the vault's payload does not
// match the commitment in the log: the vault was altered.
var ErrPayloadMismatch = errors.New("the vault's payload does not match the commitment in the log")

// LoadVault reads the vault of the epoch directory dir; Payload decrypts
// each payload with the identities when it is asked for (one age
// decryption per payload, so only the payloads used are paid for, and
// callers may decrypt in parallel). A torn final line (the writer stopped
// while writing it) holds no payload: VaultTorn reports its length.
func (o *Opener) LoadVault(dir string, ids ...age.Identity) error {
	f, err := logdir.OpenRegular(filepath.Join(dir, VaultFile))
	if err != nil {
		return fmt.Errorf("open payload vault: %w", err)
	}
	defer f.Close()
	o.vault = make(map[int64][]byte)
	o.ids = ageid.FastIdentities(ids)
	o.torn = 0
	br := bufio.NewReaderSize(f, 64<<10)
	for n := 1; ; n++ {
		line, err := readLineMax(br, maxVaultLine)
		var torn *tornLineError
		if errors.As(err, &torn) {
			o.torn = int64(torn.n) // a final fragment without '\n' is a torn write
			return nil
		}
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, errLineTooLong) {
			return fmt.Errorf("%s:%d: a line longer than %d bytes is not a vault entry: the vault was altered", VaultFile, n, maxVaultLine)
		}
		if err != nil {
			return fmt.Errorf("read payload vault: %w", err)
		}
		var vl vaultLine
		if err := jsonv2.Unmarshal(line[:len(line)-1], &vl); err != nil {
			return fmt.Errorf("%s:%d: %w", VaultFile, n, err)
		}
		o.vault[vl.ID] = vl.Age
	}
}

// MaxVaultLineBytes bounds one line of the vault when it is read: a payload
// (an argument or result, at most a few MiB on the wire), encrypted and
// base64-encoded, is far shorter.
const MaxVaultLineBytes = 64 << 20

// maxVaultLine is MaxVaultLineBytes; tests lower it.
var maxVaultLine = MaxVaultLineBytes

var errLineTooLong = errors.New("line too long")

// tornLineError is a final fragment of n bytes without '\n'.
type tornLineError struct{ n int }

func (e *tornLineError) Error() string {
	return fmt.Sprintf("incomplete final line of %d bytes", e.n)
}

// readLineMax reads one line, with its '\n', of at most max bytes. At the
// end of the input it returns io.EOF, or a *tornLineError when a final
// fragment without '\n' was read.
func readLineMax(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, errLineTooLong
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(line) > 0:
			return nil, &tornLineError{n: len(line)}
		default:
			return nil, err
		}
	}
}

// VaultTorn returns the length of the incomplete line that ends the vault
// read by LoadVault, or 0: the gateway stopped while writing a payload, and
// that payload is not in the vault.
func (o *Opener) VaultTorn() int64 { return o.torn }

// Payload decrypts the vault's payload for c and checks it against c. It is
// safe for concurrent use after LoadVault.
func (o *Opener) Payload(c record.Commitment) ([]byte, error) {
	ct, ok := o.vault[c.ID]
	if !ok {
		return nil, fmt.Errorf("commitment %d: %w", c.ID, ErrNoPayload)
	}
	r, err := age.Decrypt(bytes.NewReader(ct), o.ids...)
	if err != nil {
		return nil, fmt.Errorf("commitment %d: decrypt the vault's payload: %w", c.ID, err)
	}
	p, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("commitment %d: decrypt the vault's payload: %w", c.ID, err)
	}
	if !o.Check(c, p) {
		return nil, fmt.Errorf("commitment %d: %w", c.ID, ErrPayloadMismatch)
	}
	return p, nil
}

// ParseRecipients parses age recipient strings (age1...), one per element.
func ParseRecipients(ss []string) ([]age.Recipient, error) {
	if len(ss) == 0 {
		return nil, nil
	}
	rs, err := age.ParseRecipients(strings.NewReader(strings.Join(ss, "\n")))
	if err != nil {
		return nil, fmt.Errorf("age recipients: %w", err)
	}
	return rs, nil
}
