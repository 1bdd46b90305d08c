package evidence

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Format is the value of a bundle's "format" field.
const Format = "cmcp-evidence/v1"

// Evidence types (media-type-like names of the raw evidence).
const (
	TypeSNPReport = "application/vnd.cmcp.sev-snp.report+certtable" // SNP report (1184 bytes) followed by the GHCB certificate table (may be empty)
	TypeTDXQuote  = "application/vnd.cmcp.tdx.quote.v4"             // TDX quote version 4 with its embedded PCK chain
)

// MaxBundleSize bounds the size of a bundle document.
const MaxBundleSize = 1 << 20

// SoftwareLabel is the note every software bundle carries.
const SoftwareLabel = "software evidence: unattested, no hardware, development only"

// ErrMalformed is wrapped by every error about a bundle's structure.
var ErrMalformed = errors.New("malformed evidence bundle")

// HexBytes is a byte string written as lowercase hex in JSON.
type HexBytes []byte

// MarshalText implements encoding.TextMarshaler.
func (h HexBytes) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(h)), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (h *HexBytes) UnmarshalText(b []byte) error {
	v, err := hex.DecodeString(string(b))
	if err != nil {
		return fmt.Errorf("not hex: %v", err)
	}
	*h = v
	return nil
}

// Bundle is a versioned evidence document: what `cmcp attest` writes and what
// the audit log's genesis record carries.
type Bundle struct {
	Format      string    `json:"format"`
	Platform    string    `json:"platform"`
	Attested    bool      `json:"attested"`
	Note        string    `json:"note,omitempty"`
	Binding     Binding   `json:"binding"`
	Evidence    *Raw      `json:"evidence,omitempty"`
	Collector   string    `json:"collector"`
	CollectedAt time.Time `json:"collected_at"` // the attester's clock: a claim, not verified
}

// Binding holds the inputs of the report data.
type Binding struct {
	Domain     string        `json:"domain"`
	Hash       string        `json:"hash"`
	KeyAlg     string        `json:"key_alg"`
	PublicKey  []byte        `json:"public_key"` // base64
	Nonce      HexBytes      `json:"nonce"`
	Statement  digest.Digest `json:"statement,omitzero"`
	ReportData HexBytes      `json:"report_data"`
}

// Raw is the hardware evidence as the platform returned it.
type Raw struct {
	Type         string   `json:"type"`
	Data         []byte   `json:"data"`                   // base64
	Certificates [][]byte `json:"certificates,omitempty"` // extra DER certificates (a VCEK or VLEK fetched at attest time)
}

// NewBinding computes the binding for pub, nonce and statement.
func NewBinding(pub ed25519.PublicKey, nonce []byte, statement digest.Digest) (Binding, error) {
	rd, err := ReportData(pub, nonce, statement)
	if err != nil {
		return Binding{}, err
	}
	return Binding{
		Domain: BindingDomain, Hash: "sha512", KeyAlg: KeyAlgEd25519,
		PublicKey: append([]byte(nil), pub...), Nonce: append(HexBytes{}, nonce...),
		Statement: statement, ReportData: rd[:],
	}, nil
}

// PublicKey returns the bound key.
func (b *Bundle) PublicKey() ed25519.PublicKey { return ed25519.PublicKey(b.Binding.PublicKey) }

// Marshal encodes b as indented JSON with a trailing newline.
func (b *Bundle) Marshal() ([]byte, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// Decode parses and structurally checks a bundle. Unknown fields, trailing
// data, an unknown format or platform, and inconsistent fields are errors
// wrapping ErrMalformed. It does not verify anything cryptographic.
func Decode(data []byte) (*Bundle, error) {
	if len(data) > MaxBundleSize {
		return nil, fmt.Errorf("%w: %d bytes, at most %d allowed", ErrMalformed, len(data), MaxBundleSize)
	}
	var b Bundle
	if err := decodeStrict(data, &b); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrMalformed, jsonErr(data, err))
	}
	if err := b.check(); err != nil {
		return nil, err
	}
	return &b, nil
}

// decodeStrict decodes one JSON document into v so that every reader of it
// sees the same values: member names match exactly, and unknown or
// duplicate names, invalid UTF-8 and trailing data are refused.
// encoding/json matches names case-insensitively, which let "FORMAT" stand
// for "format", and let a "Nonce" after "nonce" (not duplicates to a
// case-sensitive parser) replace the nonce other parsers read.
func decodeStrict(data []byte, v any) error {
	opts := jsonv2.JoinOptions(jsonv2.RejectUnknownMembers(true), jsonv2.MatchCaseInsensitiveNames(false),
		jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	dec := jsontext.NewDecoder(bytes.NewReader(data), opts)
	if err := jsonv2.UnmarshalDecode(dec, v, opts); err != nil {
		return err
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return errors.New("trailing data after the JSON document")
	}
	return nil
}

// jsonErr adds the line to a decoding error, which names the member (as a
// JSON pointer) where it can.
func jsonErr(data []byte, err error) string {
	var se *jsontext.SyntacticError
	var me *jsonv2.SemanticError
	off := int64(-1)
	switch {
	case errors.As(err, &se):
		off = se.ByteOffset
	case errors.As(err, &me):
		off = me.ByteOffset
	}
	if off < 0 {
		return err.Error()
	}
	line := 1 + bytes.Count(data[:min(int(off), len(data))], []byte{'\n'})
	return fmt.Sprintf("line %d: %v", line, err)
}

func (b *Bundle) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	if b.Format != Format {
		return bad("format %q, want %q", b.Format, Format)
	}
	if !IsPlatform(b.Platform) {
		return bad("platform %q, want one of %q", b.Platform, Platforms)
	}
	if b.Attested != Attested(b.Platform) {
		return bad("attested is %v for platform %q", b.Attested, b.Platform)
	}
	bd := b.Binding
	if bd.Domain != BindingDomain || bd.Hash != "sha512" || bd.KeyAlg != KeyAlgEd25519 {
		return bad("binding domain/hash/key_alg %q/%q/%q, want %q/sha512/%s", bd.Domain, bd.Hash, bd.KeyAlg, BindingDomain, KeyAlgEd25519)
	}
	if len(bd.PublicKey) != ed25519.PublicKeySize {
		return bad("binding public_key is %d bytes, want %d", len(bd.PublicKey), ed25519.PublicKeySize)
	}
	if len(bd.Nonce) > MaxNonceSize {
		return bad("binding nonce is %d bytes, at most %d allowed", len(bd.Nonce), MaxNonceSize)
	}
	if len(bd.ReportData) != ReportDataSize {
		return bad("binding report_data is %d bytes, want %d", len(bd.ReportData), ReportDataSize)
	}
	switch b.Platform {
	case PlatformSoftware:
		if b.Evidence != nil {
			return bad("a software bundle carries no hardware evidence")
		}
		if b.Note != SoftwareLabel {
			return bad("a software bundle must carry the note %q", SoftwareLabel)
		}
	case PlatformSEVSNP, PlatformTDX:
		if b.Evidence == nil || len(b.Evidence.Data) == 0 {
			return bad("platform %s needs evidence data", b.Platform)
		}
		want := TypeSNPReport
		if b.Platform == PlatformTDX {
			want = TypeTDXQuote
		}
		if b.Evidence.Type != want {
			return bad("evidence type %q for platform %s, want %q", b.Evidence.Type, b.Platform, want)
		}
		for i, c := range b.Evidence.Certificates {
			if len(c) == 0 {
				return bad("evidence certificate %d is empty", i)
			}
		}
	}
	return nil
}

// ReadFile reads and decodes a bundle file. Errors name the file.
func ReadFile(path string) (*Bundle, error) {
	data, err := readFileMax(path, MaxBundleSize, ErrMalformed)
	if err != nil {
		return nil, err
	}
	b, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// WriteFile writes b to path atomically (a temporary file renamed into place)
// with mode 0644.
func WriteFile(path string, b *Bundle) error {
	data, err := b.Marshal()
	if err != nil {
		return err
	}
	return writeAtomic(path, data, 0o644)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(dirOf(path), ".cmcp-evidence-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func dirOf(path string) string {
	for i := len(path) - 1; i >= 0; i-- {
		if os.IsPathSeparator(path[i]) {
			if i == 0 {
				return "/"
			}
			return path[:i]
		}
	}
	return "."
}

// readFileMax is os.ReadFile that stops after limit bytes: a device such as
// /dev/zero, or a runaway file, is refused instead of read until memory
// runs out.
func readFileMax(path string, limit int64, malformed error) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: %w: larger than %d bytes", path, malformed, limit)
	}
	return data, nil
}
