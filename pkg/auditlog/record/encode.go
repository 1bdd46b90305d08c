package record

import (
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/jcs"

	"bytes"
	"encoding/base64"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"golang.org/x/mod/sumdb/tlog"
)

// FormatVersion is the "v" member of every line.
const FormatVersion = 1

// MaxRecordBytes bounds one line written by the Writer.
const MaxRecordBytes = 1 << 20

// MaxLineBytes bounds one line the Reader and the verifier accept.
const MaxLineBytes = 4 << 20

// encodeBody marshals a record body to RFC 8785 canonical JSON. Invalid
// UTF-8 in strings is replaced by U+FFFD rather than failing the record.
func EncodeBody(r Record) ([]byte, error) {
	if b, ok := appendFastBody(make([]byte, 0, 1024), r); ok {
		return b, nil
	}
	return encodeBodyGeneral(r)
}

// appendBody appends the canonical body of r to dst: call and result
// records (the gateway's per-call records) in one pass by appendFastBody,
// the others (and any value the fast encoders do not handle) by
// encodeBodyGeneral.
func AppendBody(dst []byte, r Record) ([]byte, error) {
	if b, ok := appendFastBody(dst, r); ok {
		return b, nil
	}
	body, err := encodeBodyGeneral(r)
	if err != nil {
		return dst, err
	}
	return append(dst, body...), nil
}

// encodeBodyGeneral encodes any record: marshal, canonicalize, then scan
// (which refuses integers beyond 2^53 in opaque members).
func encodeBodyGeneral(r Record) ([]byte, error) {
	raw, err := jsonv2.Marshal(r, jsontext.AllowInvalidUTF8(true), jsonv2.Deterministic(true))
	if err != nil {
		return nil, fmt.Errorf("encode %s record: %w", r.Kind(), err)
	}
	v := jsontext.Value(raw)
	if err := v.Canonicalize(); err != nil {
		return nil, fmt.Errorf("encode %s record: %w", r.Kind(), err)
	}
	if _, err := jcs.ScanLine(v); err != nil { // refuses integers beyond 2^53 in opaque fields
		return nil, fmt.Errorf("encode %s record: %w", r.Kind(), err)
	}
	return v, nil
}

// appendLine appends the canonical line for one record (without '\n'). The
// members are written in RFC 8785 order: body, kind, prev, seq, ts, v. ts is
// omitted when empty (checkpoint records).
func AppendLine(dst []byte, kind Kind, body []byte, prev tlog.Hash, seq int64, ts string) []byte {
	dst = append(dst, `{"body":`...)
	dst = append(dst, body...)
	dst = append(dst, `,"kind":"`...)
	dst = append(dst, kind...)
	dst = append(dst, `","prev":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, prev[:])
	dst = append(dst, `","seq":"`...)
	dst = strconv.AppendInt(dst, seq, 10)
	if ts != "" {
		dst = append(dst, `","ts":"`...)
		dst = append(dst, ts...)
	}
	dst = append(dst, `","v":`...)
	dst = strconv.AppendInt(dst, FormatVersion, 10)
	dst = append(dst, '}')
	return dst
}

// envelope is a parsed line: the common members and the raw body.
type Envelope struct {
	Kind Kind
	Seq  int64
	Prev tlog.Hash
	TS   []byte // aliases the line; nil for checkpoint records
	Body []byte
}

// envelopeMembers are the members of a line, in canonical order.
var envelopeMembers = [...]string{"body", "kind", "prev", "seq", "ts", "v"}

// parseLine validates a line (strict, canonical) and its common members.
// It does not allocate for a valid line.
func ParseLine(line []byte) (Envelope, error) {
	var e Envelope
	var s jcs.Scanner
	if err := s.Scan(line); err != nil {
		return e, err
	}
	if s.Extra {
		return e, &jcs.SyntaxError{Offset: 0, Msg: fmt.Sprintf("more than %d members (a record has body, kind, prev, seq, ts, v)", len(envelopeMembers))}
	}
	var have [len(envelopeMembers)]bool
	j := 0
	for _, m := range s.Top[:s.Ntop] {
		for j < len(envelopeMembers) && envelopeMembers[j] != string(m.Key) {
			j++
		}
		if j == len(envelopeMembers) {
			return e, &jcs.SyntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("unknown member %q (a record has body, kind, prev, seq, ts, v)", m.Key)}
		}
		have[j] = true
		switch j {
		case 0: // body
			if len(m.Val) == 0 || m.Val[0] != '{' {
				return e, &jcs.SyntaxError{Offset: memberOffset(line, m), Msg: "body must be an object"}
			}
			e.Body = m.Val
		case 1: // kind
			b, ok := plainString(m.Val)
			k, known := kindOf(b)
			if !ok || !known {
				return e, &jcs.SyntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("unknown kind %s", jcs.Clip(m.Val))}
			}
			e.Kind = k
		case 2: // prev
			b, ok := plainString(m.Val)
			var buf [33]byte
			var n int
			var err error
			if ok && len(b) == 44 {
				n, err = base64.StdEncoding.Strict().Decode(buf[:], b)
			}
			if !ok || len(b) != 44 || err != nil || n != tlog.HashSize {
				return e, &jcs.SyntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("prev %s is not a base64 SHA-256 hash", jcs.Clip(m.Val))}
			}
			copy(e.Prev[:], buf[:n])
		case 3: // seq
			b, ok := plainString(m.Val)
			n, ok2 := parseDecimal(b)
			if !ok || !ok2 {
				return e, &jcs.SyntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("seq %s is not a decimal string", jcs.Clip(m.Val))}
			}
			e.Seq = n
		case 4: // ts
			b, ok := plainString(m.Val)
			if !ok || !validTimestamp(b) {
				return e, &jcs.SyntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("ts %s is not an RFC 3339 UTC time", jcs.Clip(m.Val))}
			}
			e.TS = b
		case 5: // v
			if len(m.Val) != 1 || m.Val[0] != '0'+FormatVersion {
				return e, &jcs.SyntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("format version %s, this cmcp reads version %d", jcs.Clip(m.Val), FormatVersion)}
			}
		}
		j++
	}
	for i, ok := range have {
		if !ok && i != 4 {
			return e, &jcs.SyntaxError{Offset: 0, Msg: fmt.Sprintf("missing member %q", envelopeMembers[i])}
		}
	}
	switch {
	case e.Kind == KindCheckpoint && have[4]:
		return e, &jcs.SyntaxError{Offset: 0, Msg: "a checkpoint record has no ts"}
	case e.Kind != KindCheckpoint && !have[4]:
		return e, &jcs.SyntaxError{Offset: 0, Msg: "missing member \"ts\""}
	}
	return e, nil
}

// kindOf maps a kind name to its constant without allocating.
func kindOf(b []byte) (Kind, bool) {
	switch string(b) {
	case "genesis":
		return KindGenesis, true
	case "segment":
		return KindSegment, true
	case "checkpoint":
		return KindCheckpoint, true
	case "recovery":
		return KindRecovery, true
	case "seal":
		return KindSeal, true
	case "spawn":
		return KindSpawn, true
	case "upstream":
		return KindUpstream, true
	case "drift":
		return KindDrift, true
	case "session":
		return KindSession, true
	case "call":
		return KindCall, true
	case "access":
		return KindAccess, true
	case "result":
		return KindResult, true
	case "stderr":
		return KindStderr, true
	case "policy":
		return KindPolicy, true
	case "admin":
		return KindAdmin, true
	case "credential_minted":
		return KindCredential, true
	case "machine":
		return KindMachine, true
	}
	return "", false
}

// parseDecimal parses a non-negative decimal without leading zeros.
func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 || len(b) > 1 && b[0] == '0' {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// validTimestamp checks "YYYY-MM-DDTHH:MM:SS[.fraction]Z" as the writer
// produces it (time.RFC3339Nano in UTC), without allocating.
func validTimestamp(b []byte) bool {
	if len(b) < 20 || len(b) > 30 || b[len(b)-1] != 'Z' {
		return false
	}
	_, err := time.Parse(time.RFC3339Nano, unsafeString(b))
	return err == nil
}

// unsafeString views b as a string without copying; b must not change
// while the string is in use.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// memberOffset is the offset of m's value within line.
func memberOffset(line []byte, m jcs.Member) int {
	if len(m.Val) == 0 {
		return 0
	}
	// m.val aliases line.
	return cap(line) - cap(m.Val)
}

// plainString returns the contents of a JSON string without escapes.
func plainString(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return nil, false
	}
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') >= 0 {
		return nil, false
	}
	return s, true
}
