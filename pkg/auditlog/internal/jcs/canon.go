// Package jcs checks that a line is JSON in RFC 8785 (JCS) canonical form
// in a single pass, and returns its top-level members. The audit log's
// reader and verifier refuse any line it refuses (FORMAT.md section 2); the
// writer's fast encoder uses it to tell which values it may copy as they are.
package jcs

import (
	"bytes"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// maxDepth bounds nesting in a line, like jsontext's own limit.
const maxDepth = 10000

// maxSafeInt is 2^53: integers beyond it have no exact RFC 8785 form.
const maxSafeInt = 1 << 53

// SyntaxError is a problem at a byte offset within one line.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("byte %d of the line: %s", e.Offset, e.Msg) }

// Member is one top-level member of a line's object.
type Member struct {
	Key []byte // unescaped name
	Val []byte
}

// maxTop is how many top-level members ScanLine records (a record has 6).
const maxTop = 8

// Scanner checks in a single pass that a line is strict JSON in RFC
// 8785 canonical form: no insignificant whitespace, object members sorted by
// the UTF-16 code units of their names with no duplicates, strings escaped
// exactly as JCS does and valid UTF-8, integers in plain decimal. A number
// with a fraction or exponent makes it fall back to jsontext's canonicalizer
// for the whole line (records written by cmcp never hold one).
type Scanner struct {
	b        []byte
	i        int
	depth    int
	fallback bool
	Top      [maxTop]Member
	Ntop     int
	Extra    bool // more than maxTop top-level members
}

func (s *Scanner) fail(format string, args ...any) error {
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			return &SyntaxError{Offset: s.i, Msg: "whitespace between tokens (not in RFC 8785 canonical form)"}
		}
	}
	return &SyntaxError{Offset: s.i, Msg: fmt.Sprintf(format, args...)}
}

// ScanLine validates line and returns its top-level members in order. The
// line must be an object.
func ScanLine(line []byte) ([]Member, error) {
	s := &Scanner{}
	if err := s.Scan(line); err != nil {
		return nil, err
	}
	return append([]Member(nil), s.Top[:s.Ntop]...), nil
}

// Scan validates line, recording up to maxTop top-level members in
// s.Top[:s.Ntop] (Extra is set when there are more).
func (s *Scanner) Scan(line []byte) error {
	s.b = line
	if len(line) == 0 || line[0] != '{' {
		return s.fail("a record must be a JSON object starting with '{'")
	}
	if err := s.object(true); err != nil {
		return err
	}
	if s.i != len(line) {
		return s.fail("unexpected data after the record's closing '}' (a line holds exactly one object)")
	}
	if s.fallback {
		v := jsontext.Value(bytes.Clone(line))
		if err := v.Canonicalize(); err != nil {
			return &SyntaxError{Offset: 0, Msg: fmt.Sprintf("not valid JSON: %v", err)}
		}
		if !bytes.Equal(v, line) {
			return &SyntaxError{Offset: firstDiff(v, line), Msg: "not in RFC 8785 canonical form (a number is not written the way JCS writes it)"}
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func (s *Scanner) value() error {
	if s.i >= len(s.b) {
		return s.fail("unexpected end of line")
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object(false)
	case c == '[':
		return s.array()
	case c == '"':
		_, err := s.str()
		return err
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == ' ' || c == '\t' || c == '\r' || c == '\n':
		return s.fail("whitespace between tokens (not canonical)")
	default:
		return s.fail("invalid character %q", rune(c))
	}
}

func (s *Scanner) literal(lit string) error {
	if !bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		return s.fail("invalid literal (want %s)", lit)
	}
	s.i += len(lit)
	return nil
}

func (s *Scanner) enter() error {
	s.depth++
	if s.depth > maxDepth {
		return s.fail("nested deeper than %d levels", maxDepth)
	}
	return nil
}

func (s *Scanner) object(top bool) error {
	if err := s.enter(); err != nil {
		return err
	}
	s.i++ // '{'
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return nil
	}
	var prevKey []byte
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return s.fail("expected a member name in quotes")
		}
		keyStart := s.i
		raw, err := s.str()
		if err != nil {
			return err
		}
		if prevKey != nil {
			switch cmp := compareKeys(prevKey, raw); {
			case cmp == 0:
				return &SyntaxError{Offset: keyStart, Msg: fmt.Sprintf("duplicate object member name %s", Clip(s.b[keyStart:s.i]))}
			case cmp > 0:
				return &SyntaxError{Offset: keyStart, Msg: fmt.Sprintf("member %s is out of order (RFC 8785 sorts names; not canonical)", Clip(s.b[keyStart:s.i]))}
			}
		}
		prevKey = raw
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return s.fail("expected ':' after a member name")
		}
		s.i++
		valStart := s.i
		if err := s.value(); err != nil {
			return err
		}
		if top {
			k := raw
			if bytes.IndexByte(raw, '\\') >= 0 {
				u, err := jsontext.AppendUnquote(nil, s.b[keyStart:valStart-1])
				if err != nil {
					return &SyntaxError{Offset: keyStart, Msg: err.Error()}
				}
				k = u
			}
			if s.Ntop < maxTop {
				s.Top[s.Ntop] = Member{Key: k, Val: s.b[valStart:s.i]}
				s.Ntop++
			} else {
				s.Extra = true
			}
		}
		if s.i >= len(s.b) {
			return s.fail("unexpected end of line inside an object")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return nil
		default:
			return s.fail("expected ',' or '}' in an object")
		}
	}
}

func (s *Scanner) array() error {
	if err := s.enter(); err != nil {
		return err
	}
	s.i++ // '['
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		s.depth--
		return nil
	}
	for {
		if err := s.value(); err != nil {
			return err
		}
		if s.i >= len(s.b) {
			return s.fail("unexpected end of line inside an array")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			s.depth--
			return nil
		default:
			return s.fail("expected ',' or ']' in an array")
		}
	}
}

// str scans a string at s.i and returns its raw contents (between the
// quotes, still escaped).
func (s *Scanner) str() ([]byte, error) {
	s.i++ // opening quote
	start := s.i
	for s.i < len(s.b) {
		// Fast path: printable ASCII other than '"' and '\\'.
		for s.i < len(s.b) && PlainByte[s.b[s.i]] {
			s.i++
		}
		if s.i >= len(s.b) {
			break
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			raw := s.b[start:s.i]
			s.i++
			return raw, nil
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return nil, s.fail("unexpected end of line in an escape")
			}
			switch s.b[s.i+1] {
			case '"', '\\', 'b', 't', 'n', 'f', 'r':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return nil, s.fail("truncated \\u escape")
				}
				h := s.b[s.i+2 : s.i+6]
				// JCS escapes only control characters without a short form,
				// as \u00xx with lowercase hex.
				if h[0] != '0' || h[1] != '0' || !(h[2] == '0' || h[2] == '1') || !isLowerHex(h[3]) {
					return nil, s.fail("escape \\u%s is not how RFC 8785 writes that character (not canonical)", string(h))
				}
				switch v := (h[2]-'0')<<4 | unhex(h[3]); v {
				case '\b', '\t', '\n', '\f', '\r':
					return nil, s.fail("escape \\u%s has a short form in RFC 8785 (not canonical)", string(h))
				}
				s.i += 6
			default:
				return nil, s.fail("escape \\%c is invalid or not canonical", s.b[s.i+1])
			}
		case c < 0x20:
			return nil, s.fail("raw control character 0x%02x in a string", c)
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, n := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && n <= 1 {
				return nil, s.fail("invalid UTF-8 in a string")
			}
			s.i += n
		}
	}
	return nil, s.fail("unterminated string")
}

// PlainByte marks bytes that stand for themselves in a canonical string.
var PlainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isLowerHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

func (s *Scanner) number() error {
	start := s.i
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i >= len(s.b) || s.b[s.i] < '0' || s.b[s.i] > '9' {
		return s.fail("invalid number")
	}
	if s.b[s.i] == '0' {
		s.i++
		if s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			return s.fail("number with a leading zero")
		}
	} else {
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		// Not an integer: validate the syntax and let jsontext decide the
		// canonical form.
		if s.b[s.i] == '.' {
			s.i++
			if s.i >= len(s.b) || s.b[s.i] < '0' || s.b[s.i] > '9' {
				return s.fail("invalid number")
			}
			for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
				s.i++
			}
		}
		if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
			s.i++
			if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
				s.i++
			}
			if s.i >= len(s.b) || s.b[s.i] < '0' || s.b[s.i] > '9' {
				return s.fail("invalid number")
			}
			for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
				s.i++
			}
		}
		s.fallback = true
		return nil
	}
	lit := s.b[start:s.i]
	if string(lit) == "-0" {
		return &SyntaxError{Offset: start, Msg: "-0 is written 0 in RFC 8785 (not canonical)"}
	}
	digits := lit
	if digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) > 16 {
		return &SyntaxError{Offset: start, Msg: fmt.Sprintf("integer %s is beyond ±2^53 (write it as a string)", Clip(lit))}
	}
	var n uint64
	for _, d := range digits {
		n = n*10 + uint64(d-'0')
	}
	if n > maxSafeInt {
		return &SyntaxError{Offset: start, Msg: fmt.Sprintf("integer %s is beyond ±2^53 (write it as a string)", Clip(lit))}
	}
	return nil
}

// compareKeys compares two raw (escaped) member names by the UTF-16 code
// units of their values, as RFC 8785 §3.2.3 orders them.
func compareKeys(a, b []byte) int {
	if isPlain(a) && isPlain(b) {
		return bytes.Compare(a, b)
	}
	ua := keyUnits(a)
	ub := keyUnits(b)
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			if ua[i] < ub[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(ua) < len(ub):
		return -1
	case len(ua) > len(ub):
		return 1
	}
	return 0
}

// isPlain reports whether raw has no escapes and no bytes beyond ASCII, so
// that byte order is UTF-16 order.
func isPlain(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func keyUnits(raw []byte) []uint16 {
	q := make([]byte, 0, len(raw)+2)
	q = append(q, '"')
	q = append(q, raw...)
	q = append(q, '"')
	u, err := jsontext.AppendUnquote(nil, q)
	if err != nil {
		u = raw
	}
	return utf16.Encode([]rune(string(u)))
}

// Clip returns b as a string for an error message, shortened when long.
func Clip(b []byte) string {
	if len(b) > 60 {
		return string(b[:57]) + "..."
	}
	return string(b)
}

// CanonicalID reports whether a JSON-RPC id is a string or an integer
// already in RFC 8785 form (so that the general path would copy it as is).
func CanonicalID(raw []byte) bool {
	if len(raw) == 0 || !(raw[0] == '"' || raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		return false
	}
	s := Scanner{b: raw}
	return s.value() == nil && s.i == len(raw) && !s.fallback
}
