package rpcwire

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// TestEachMember: the members of a valid object, in order and byte for
// byte; false for anything that is not an object and for a name with an
// escape (the caller must decode those in full).
func TestEachMember(t *testing.T) {
	type kv struct{ k, v string }
	for _, tc := range []struct {
		in   string
		want []kv
		ok   bool
	}{
		{`{}`, nil, true},
		{` { } `, nil, true},
		{`{"a":1}`, []kv{{"a", "1"}}, true},
		{"{ \"a\" :\t\"x,}]\\\"\" ,\n\"b\":{\"c\":[1,{\"d\":\"}\"}]},\"e\":null,\"f\":-1.5e3 }",
			[]kv{{"a", `"x,}]\""`}, {"b", `{"c":[1,{"d":"}"}]}`}, {"e", "null"}, {"f", "-1.5e3"}}, true},
		{`{"a":[],"b":true}`, []kv{{"a", "[]"}, {"b", "true"}}, true},
		{`{"\u0061":1}`, nil, false},
		{`[1]`, nil, false},
		{`"s"`, nil, false},
		{``, nil, false},
	} {
		var got []kv
		ok := EachMember([]byte(tc.in), func(k, v []byte) { got = append(got, kv{string(k), string(v)}) })
		if ok != tc.ok || (ok && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("EachMember(%q) = %v %v, want %v %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// skipStringByByte is skipString as it was written first, one byte at a
// time: the reference TestSkipStringMatchesByteScan holds skipString to.
func skipStringByByte(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// TestSkipStringMatchesByteScan: skipString ends a string where a scan of
// its bytes one at a time does, for every start in strings made of quotes,
// backslashes and other bytes (escaped quotes, escaped backslashes before
// a quote, a backslash at the very end, no closing quote), and in long
// strings with an escape near either end.
func TestSkipStringMatchesByteScan(t *testing.T) {
	alphabet := []byte{'"', '\\', 'a', 'u', '}'}
	var cases [][]byte
	var gen func(prefix []byte, n int)
	gen = func(prefix []byte, n int) {
		cases = append(cases, append([]byte(nil), prefix...))
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			gen(append(prefix, c), n-1)
		}
	}
	gen([]byte{'"'}, 7)
	long := bytes.Repeat([]byte("x"), 70000)
	for _, at := range []int{0, 1, 15, 16, 17, 31, 32, 33, 69990, 69998, 69999} {
		for _, ins := range []string{`\"`, `\\`, `\\"`, `"`} {
			b := append([]byte{'"'}, long...)
			b = append(b[:1+at], append([]byte(ins), b[1+at:]...)...)
			cases = append(cases, b, append(b, '"'))
		}
	}
	// Escapes all along (a text of '<' as JSON encoders write it), with
	// an escaped quote, an escaped backslash and a quote among them.
	escapes := bytes.Repeat([]byte(`\u003c`), 12000)
	for _, at := range []int{0, 6, 36000, 71994} {
		for _, ins := range []string{`\"`, `\\`, `\\"`, `"`, `x`} {
			b := append([]byte{'"'}, escapes...)
			b = append(b[:1+at], append([]byte(ins), b[1+at:]...)...)
			cases = append(cases, b, append(b, '"'))
		}
	}
	for _, b := range cases {
		for i := range b {
			if b[i] != '"' {
				continue
			}
			if got, want := skipString(b, i), skipStringByByte(b, i); got != want {
				t.Fatalf("skipString(%q, %d) = %d, the byte scan says %d", clipped(b), i, got, want)
			}
		}
	}
}

func clipped(b []byte) []byte {
	if len(b) > 80 {
		return append(append(append([]byte(nil), b[:40]...), "..."...), b[len(b)-37:]...)
	}
	return b
}

// BenchmarkEachMember finds the members of a tools/call result, with a
// short text and with 64 KiB of it (skipString: before the IndexByte
// scan, 108–230 µs for 64 KiB on the benchmark machine), and with 64 KiB
// of escapes (\u003c, as JSON encoders write '<').
func BenchmarkEachMember(b *testing.B) {
	texts := map[string]string{"5B": "xxxxx", "65536B": strings.Repeat("x", 64<<10), "65536B-escapes": strings.Repeat(`\u003c`, 64<<10/6)}
	for _, name := range []string{"5B", "65536B", "65536B-escapes"} {
		res := []byte(`{"content":[{"type":"text","text":"` + texts[name] + `\"."}],"isError":false}`)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(res)))
			for b.Loop() {
				if !EachMember(res, func(name, value []byte) {}) {
					b.Fatal("not an object")
				}
			}
		})
	}
}
