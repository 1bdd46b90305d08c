package record

import (
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/jcs"

	"encoding/base64"
	"encoding/hex"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// The gateway writes a call and a result record for every tools/call, a
// session record at every initialize, and an upstream record ("assigned")
// on a session's first call that takes a warm spare. Their bodies are written here directly in RFC 8785 form,
// members in sorted order, instead of marshalling, canonicalizing and
// scanning them (the general path, cold at a session's first call, took
// tens of microseconds of it). The
// output is byte for byte what encodeBodyGeneral produces (TestFastEncoding
// and FuzzFastEncoding compare them); anything this code does not handle
// exactly (an unusual request id, a time outside RFC 3339) makes it report
// false and the record takes the general path, errors included.

// appendFastBody appends the canonical body of r if r is a kind with a fast
// encoder and every value in it is one the fast encoder handles.
func appendFastBody(dst []byte, r Record) ([]byte, bool) {
	switch r := r.(type) {
	case *Call:
		if r != nil {
			return r.appendCanonical(dst)
		}
	case *Result:
		if r != nil {
			return r.appendCanonical(dst), true
		}
	case *Upstream:
		if r != nil {
			return r.appendCanonical(dst), true
		}
	case *Session:
		if r != nil {
			return r.appendCanonical(dst), true
		}
	}
	return dst, false
}

func (s *Session) appendCanonical(b []byte) []byte {
	b = append(b, `{"agent":`...)
	b = appendJSONString(b, s.Agent)
	if s.ClientName != "" {
		b = append(b, `,"client_name":`...)
		b = appendJSONString(b, s.ClientName)
	}
	if s.ClientVersion != "" {
		b = append(b, `,"client_version":`...)
		b = appendJSONString(b, s.ClientVersion)
	}
	b = append(b, `,"event":`...)
	b = appendJSONString(b, s.Event)
	if s.Front != "" {
		b = append(b, `,"front":`...)
		b = appendJSONString(b, s.Front)
	}
	if s.Groups != nil {
		b = append(b, `,"groups":`...)
		b = appendStrings(b, s.Groups)
	}
	b = append(b, `,"id":`...)
	b = appendJSONString(b, s.ID)
	if s.Issuer != "" {
		b = append(b, `,"issuer":`...)
		b = appendJSONString(b, s.Issuer)
	}
	if s.Protocol != "" {
		b = append(b, `,"protocol":`...)
		b = appendJSONString(b, s.Protocol)
	}
	if s.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, s.Reason)
	}
	if s.TokenID != "" {
		b = append(b, `,"token_id":`...)
		b = appendJSONString(b, s.TokenID)
	}
	return append(b, '}')
}

func (u *Upstream) appendCanonical(b []byte) []byte {
	b = append(b, '{')
	if u.Endpoint != "" {
		b = append(b, `"endpoint":`...)
		b = appendJSONString(b, u.Endpoint)
		b = append(b, ',')
	}
	b = append(b, `"event":`...)
	b = appendJSONString(b, u.Event)
	b = append(b, `,"evidence_class":`...)
	b = appendJSONString(b, u.EvidenceClass)
	b = append(b, `,"name":`...)
	b = appendJSONString(b, u.Name)
	if u.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, u.Reason)
	}
	if u.ServerName != "" {
		b = append(b, `,"server_name":`...)
		b = appendJSONString(b, u.ServerName)
	}
	if u.ServerVersion != "" {
		b = append(b, `,"server_version":`...)
		b = appendJSONString(b, u.ServerVersion)
	}
	if u.Session != "" {
		b = append(b, `,"session":`...)
		b = appendJSONString(b, u.Session)
	}
	if !u.SPKI.IsZero() {
		b = append(b, `,"spki":`...)
		b = appendDigest(b, u.SPKI)
	}
	if u.Tools != 0 {
		b = append(b, `,"tools":`...)
		b = appendQuotedInt(b, u.Tools)
	}
	b = append(b, `,"transport":`...)
	b = appendJSONString(b, u.Transport)
	return append(b, '}')
}

func (c *Call) appendCanonical(b []byte) ([]byte, bool) {
	b = append(b, `{"agent":`...)
	b = appendJSONString(b, c.Agent)
	if !c.Args.IsZero() {
		b = append(b, `,"args":`...)
		b = appendCommitment(b, c.Args)
	}
	b = append(b, `,"decision":`...)
	b = appendJSONString(b, c.Decision)
	b = append(b, `,"evidence_class":`...)
	b = appendJSONString(b, c.EvidenceClass)
	if c.Machine != "" {
		b = append(b, `,"machine":`...)
		b = appendJSONString(b, c.Machine)
	}
	b = append(b, `,"outcome":`...)
	b = appendJSONString(b, c.Outcome)
	if !c.PolicyBundle.IsZero() {
		b = append(b, `,"policy_bundle":`...)
		b = appendDigest(b, c.PolicyBundle)
	}
	if c.PolicyIDs != nil {
		b = append(b, `,"policy_ids":`...)
		b = appendStrings(b, c.PolicyIDs)
	}
	if c.PolicyInput != nil {
		b = append(b, `,"policy_input":`...)
		var ok bool
		if b, ok = c.PolicyInput.appendCanonical(b); !ok {
			return b, false
		}
	}
	b = append(b, `,"policy_mode":`...)
	b = appendJSONString(b, c.PolicyMode)
	if c.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, c.Reason)
	}
	if c.RequestID != nil {
		if !jcs.CanonicalID(c.RequestID) {
			return b, false
		}
		b = append(b, `,"request_id":`...)
		b = append(b, c.RequestID...)
	}
	b = append(b, `,"session":`...)
	b = appendJSONString(b, c.Session)
	b = append(b, `,"tool":`...)
	b = appendJSONString(b, c.Tool)
	b = append(b, `,"upstream":`...)
	b = appendJSONString(b, c.Upstream)
	if c.UpstreamTool != "" {
		b = append(b, `,"upstream_tool":`...)
		b = appendJSONString(b, c.UpstreamTool)
	}
	return append(b, '}'), true
}

func (p *PolicyInput) appendCanonical(b []byte) ([]byte, bool) {
	b = append(b, '{')
	if p.Errors != nil {
		b = append(b, `"errors":`...)
		b = appendStrings(b, p.Errors)
		b = append(b, ',')
	}
	b = append(b, `"evidence_class":`...)
	b = appendJSONString(b, p.EvidenceClass)
	if p.Groups != nil {
		b = append(b, `,"groups":`...)
		b = appendStrings(b, p.Groups)
	}
	b = append(b, `,"hints":{"destructiveHint":`...)
	b = strconv.AppendBool(b, p.Hints.Destructive)
	b = append(b, `,"idempotentHint":`...)
	b = strconv.AppendBool(b, p.Hints.Idempotent)
	b = append(b, `,"openWorldHint":`...)
	b = strconv.AppendBool(b, p.Hints.OpenWorld)
	b = append(b, `,"readOnlyHint":`...)
	b = strconv.AppendBool(b, p.Hints.ReadOnly)
	b = append(b, '}')
	if p.Machine != "" {
		b = append(b, `,"machine":`...)
		b = appendJSONString(b, p.Machine)
	}
	b = append(b, `,"session_calls":`...)
	b = appendQuotedInt(b, p.SessionCalls)
	b = append(b, `,"time":`...)
	var ok bool
	if b, ok = appendTime(b, p.Time); !ok {
		return b, false
	}
	if p.ToolsUsed != nil {
		b = append(b, `,"tools_used":`...)
		b = appendStrings(b, p.ToolsUsed)
	}
	return append(b, '}'), true
}

func (r *Result) appendCanonical(b []byte) []byte {
	b = append(b, `{"call":`...)
	b = appendQuotedInt(b, r.Call)
	if r.ErrorCode != 0 {
		b = append(b, `,"error_code":`...)
		b = appendQuotedInt(b, r.ErrorCode)
	}
	b = append(b, `,"latency_us":`...)
	b = appendQuotedInt(b, r.LatencyMicros)
	b = append(b, `,"outcome":`...)
	b = appendJSONString(b, r.Outcome)
	if r.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, r.Reason)
	}
	if !r.Result.IsZero() {
		b = append(b, `,"result":`...)
		b = appendCommitment(b, r.Result)
	}
	b = append(b, `,"session":`...)
	b = appendJSONString(b, r.Session)
	return append(b, '}')
}

// appendCommitment writes a non-zero commitment: {"bytes","hmac","id"}.
func appendCommitment(b []byte, c Commitment) []byte {
	b = append(b, `{"bytes":`...)
	b = appendQuotedInt(b, c.Size)
	b = append(b, `,"hmac":"`...)
	b = base64.StdEncoding.AppendEncode(b, c.MAC)
	b = append(b, `","id":`...)
	b = appendQuotedInt(b, c.ID)
	return append(b, '}')
}

// appendDigest writes a non-zero digest as its text form "sha256:<hex>".
func appendDigest(b []byte, d digest.Digest) []byte {
	sum := d.Sum()
	b = append(b, '"')
	b = append(b, digest.Prefix...)
	b = hex.AppendEncode(b, sum[:])
	return append(b, '"')
}

// appendQuotedInt writes an int64 with the ",string" option: "<decimal>".
func appendQuotedInt(b []byte, n int64) []byte {
	b = append(b, '"')
	b = strconv.AppendInt(b, n, 10)
	return append(b, '"')
}

func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

// appendTime writes t as jsonv2 does by default (RFC 3339 with nanoseconds)
// and reports false where jsonv2 refuses the time (a year beyond four
// digits, a zone offset that RFC 3339 cannot hold).
func appendTime(b []byte, t time.Time) ([]byte, bool) {
	b = append(b, '"')
	n0 := len(b)
	b = t.AppendFormat(b, time.RFC3339Nano)
	s := b[n0:]
	if len(s) < len("2006-01-02T15:04:05Z") || s[4] != '-' {
		return b, false
	}
	if s[len(s)-1] != 'Z' {
		// "±hh:mm": jsonv2 refuses a seconds part or an hour beyond 23.
		z := s[len(s)-len("Z07:00"):]
		if z[0] != '+' && z[0] != '-' || z[1] > '2' || z[1] == '2' && z[2] > '3' {
			return b, false
		}
	}
	return append(b, '"'), true
}

// appendJSONString writes s as an RFC 8785 string: '"', '\\' and control
// characters escaped (short forms where JSON has them, else \u00xx), every
// other character as its UTF-8 bytes, invalid UTF-8 replaced by U+FFFD one
// byte at a time as the marshaller does with AllowInvalidUTF8.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if jcs.PlainByte[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\t':
				b = append(b, '\\', 't')
			case '\n':
				b = append(b, '\\', 'n')
			case '\f':
				b = append(b, '\\', 'f')
			case '\r':
				b = append(b, '\\', 'r')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, s[start:i]...)
			b = append(b, "\uFFFD"...)
			i++
			start = i
			continue
		}
		i += n
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
