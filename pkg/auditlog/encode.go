package auditlog

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"time"

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
func encodeBody(r Record) ([]byte, error) {
	raw, err := jsonv2.Marshal(r, jsontext.AllowInvalidUTF8(true), jsonv2.Deterministic(true))
	if err != nil {
		return nil, fmt.Errorf("encode %s record: %w", r.Kind(), err)
	}
	v := jsontext.Value(raw)
	if err := v.Canonicalize(); err != nil {
		return nil, fmt.Errorf("encode %s record: %w", r.Kind(), err)
	}
	if _, err := scanLine(v); err != nil { // refuses integers beyond 2^53 in opaque fields
		return nil, fmt.Errorf("encode %s record: %w", r.Kind(), err)
	}
	return v, nil
}

// appendLine appends the canonical line for one record (without '\n'). The
// members are written in RFC 8785 order: body, kind, prev, seq, ts, v. ts is
// omitted when empty (checkpoint records).
func appendLine(dst []byte, kind Kind, body []byte, prev tlog.Hash, seq int64, ts string) []byte {
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

// timestamp formats t as the "ts" member: RFC 3339, UTC, nanoseconds.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// envelope is a parsed line: the common members and the raw body.
type envelope struct {
	Kind Kind
	Seq  int64
	Prev tlog.Hash
	TS   string
	Body []byte
}

// parseLine validates a line (strict, canonical) and its common members.
func parseLine(line []byte) (envelope, error) {
	var e envelope
	ms, err := scanLine(line)
	if err != nil {
		return e, err
	}
	want := []string{"body", "kind", "prev", "seq", "ts", "v"}
	j := 0
	var haveTS bool
	for _, m := range ms {
		for j < len(want) && want[j] != m.key {
			j++
		}
		if j == len(want) {
			return e, &syntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("unknown member %q (a record has body, kind, prev, seq, ts, v)", m.key)}
		}
		switch m.key {
		case "body":
			if len(m.val) == 0 || m.val[0] != '{' {
				return e, &syntaxError{Offset: memberOffset(line, m), Msg: "body must be an object"}
			}
			e.Body = m.val
		case "kind":
			s, ok := plainString(m.val)
			if !ok || !knownKinds[Kind(s)] {
				return e, &syntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("unknown kind %s", clipBytes(m.val))}
			}
			e.Kind = Kind(s)
		case "prev":
			s, ok := plainString(m.val)
			var hb []byte
			var err error
			if ok && len(s) == 44 {
				hb, err = base64.StdEncoding.Strict().DecodeString(s)
			}
			if !ok || len(s) != 44 || err != nil || len(hb) != tlog.HashSize {
				return e, &syntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("prev %s is not a base64 SHA-256 hash", clipBytes(m.val))}
			}
			e.Prev = tlog.Hash(hb)
		case "seq":
			s, ok := plainString(m.val)
			n, err := strconv.ParseInt(s, 10, 64)
			if !ok || err != nil || n < 0 || strconv.FormatInt(n, 10) != s {
				return e, &syntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("seq %s is not a decimal string", clipBytes(m.val))}
			}
			e.Seq = n
		case "ts":
			s, ok := plainString(m.val)
			if !ok {
				return e, &syntaxError{Offset: memberOffset(line, m), Msg: "ts must be a string"}
			}
			if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
				return e, &syntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("ts %q is not an RFC 3339 time", s)}
			}
			e.TS = s
			haveTS = true
		case "v":
			if string(m.val) != strconv.Itoa(FormatVersion) {
				return e, &syntaxError{Offset: memberOffset(line, m), Msg: fmt.Sprintf("format version %s, this cmcp reads version %d", clipBytes(m.val), FormatVersion)}
			}
		}
		j++
	}
	switch {
	case e.Body == nil:
		return e, &syntaxError{Offset: 0, Msg: "missing member \"body\""}
	case e.Kind == "":
		return e, &syntaxError{Offset: 0, Msg: "missing member \"kind\""}
	case !haveMember(ms, "prev"):
		return e, &syntaxError{Offset: 0, Msg: "missing member \"prev\""}
	case !haveMember(ms, "seq"):
		return e, &syntaxError{Offset: 0, Msg: "missing member \"seq\""}
	case !haveMember(ms, "v"):
		return e, &syntaxError{Offset: 0, Msg: "missing member \"v\""}
	case e.Kind == KindCheckpoint && haveTS:
		return e, &syntaxError{Offset: 0, Msg: "a checkpoint record has no ts"}
	case e.Kind != KindCheckpoint && !haveTS:
		return e, &syntaxError{Offset: 0, Msg: "missing member \"ts\""}
	}
	return e, nil
}

func haveMember(ms []member, k string) bool {
	for _, m := range ms {
		if m.key == k {
			return true
		}
	}
	return false
}

// memberOffset is the offset of m's value within line.
func memberOffset(line []byte, m member) int {
	if len(m.val) == 0 {
		return 0
	}
	// m.val aliases line.
	return cap(line) - cap(m.val)
}

// plainString returns the contents of a JSON string without escapes.
func plainString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	s := v[1 : len(v)-1]
	for _, c := range s {
		if c == '\\' {
			return "", false
		}
	}
	return string(s), true
}
