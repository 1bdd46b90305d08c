package rpcwire

import (
	"bytes"
)

// The scanner: once a message is known to be valid JSON in the strict
// sense jsontext checks (RFC 7493: valid UTF-8, no duplicate names at any
// depth), its members can be found by skipping values, without decoding
// them. That is several times cheaper than unmarshalling into a struct,
// and cheaper still when the gateway has been idle and its caches are
// cold, which is when a call at concurrency 1 arrives.

// EachMember calls f with the raw name (without its quotes) and the raw
// value of every member of obj, in order. obj must be valid JSON (checked
// by the caller). It reports false, having called f for none or only some
// members, if obj is not an object or a member name holds an escape
// sequence: the caller must then decode obj in full.
func EachMember(obj []byte, f func(name, value []byte)) bool {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return true
	}
	for i < len(obj) {
		// i is at a member name's opening quote.
		end := skipString(obj, i)
		name := obj[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			return false
		}
		i = skipSpace(obj, end)
		i = skipSpace(obj, i+1) // past ':'
		vend := skipValue(obj, i)
		f(name, obj[i:vend])
		i = skipSpace(obj, vend)
		if i >= len(obj) || obj[i] == '}' {
			return true
		}
		i = skipSpace(obj, i+1) // past ','
	}
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index just past the string starting at b[i].
// Most strings (member names, ids, methods) end within a few bytes, which
// are looked at one at a time; past those it finds the next quote and
// checks the bytes before it for a backslash with bytes.IndexByte, which
// scans many bytes at a time: a 64 KiB string (a tool's text) is skipped
// in microseconds, not a tenth of a millisecond.
func skipString(b []byte, i int) int {
	j := i + 1
	for end := min(j+16, len(b)); j < end; j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	for j < len(b) {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return len(b)
		}
		q += j
		// The escapes before this quote, each looked for from the one
		// before (not from the start again, and the quote not looked for
		// again unless it is escaped): a string of many escapes, such as
		// a text encoded as \u003c, is skipped in one pass, not in time
		// that grows with the square of its length.
		for {
			e := bytes.IndexByte(b[j:q], '\\')
			if e < 0 {
				return q + 1 // no escape left before this quote: it ends the string
			}
			if j += e + 2; j > q { // past the backslash and the byte it escapes
				break // that byte was the quote: look for the next one
			}
		}
	}
	return len(b)
}

// skipValue returns the index just past the valid JSON value at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = skipString(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return j
		}
		j++
	}
	return j
}

// plainString returns the contents of the JSON string v if it holds no
// escape sequence; ok is false otherwise (or if v is not a string).
func plainString(v []byte) (s string, ok bool) {
	if len(v) < 2 || v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 {
		return "", false
	}
	return string(v[1 : len(v)-1]), true
}
