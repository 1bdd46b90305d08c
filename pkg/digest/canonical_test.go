package digest

import (
	"errors"
	"testing"
)

func TestCanonicalize(t *testing.T) {
	tests := []struct {
		name, in, want string
		err            error
	}{
		{"sorts keys and strips space", `{ "b": 1, "a": [true, null, "x"] }`, `{"a":[true,null,"x"],"b":1}`, nil},
		{"html characters stay raw", `{"a":"<>&\u2028"}`, "{\"a\":\"<>&\u2028\"}", nil},
		{"numbers in ES6 form", `[1.0, 1e3, -0, 0.1]`, `[1,1000,0,0.1]`, nil},
		{"2^53 is fine", `9007199254740992`, `9007199254740992`, nil},
		{"beyond 2^53 refused", `{"n":9007199254740993}`, "", ErrNotCanonicalizable},
		{"duplicate keys refused", `{"a":1,"a":2}`, "", ErrNotCanonicalizable},
		{"invalid utf-8 refused", "\"\xff\"", "", ErrNotCanonicalizable},
		{"trailing garbage refused", `{} x`, "", ErrNotCanonicalizable},
		{"empty refused", ``, "", ErrNotCanonicalizable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in))
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Canonicalize(%q) error = %v, want %v", tt.in, err, tt.err)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("Canonicalize(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
			if !IsCanonical(got) {
				t.Fatalf("output %q is not canonical", got)
			}
		})
	}
}

func TestParse(t *testing.T) {
	good := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	d, err := Parse(good)
	if err != nil || d.String() != good {
		t.Fatalf("Parse(good) = %v, %v", d, err)
	}
	if !d.Equal(MustParse(good)) {
		t.Fatal("equal digests compare unequal")
	}
	if (Digest{}).Equal(Digest{}) {
		t.Fatal("two zero digests must not be equal")
	}
	for _, bad := range []string{"", "sha256:", "sha512:" + good[7:], "SHA256:" + good[7:], "sha256:" + good[8:], "sha256:" + good[7:] + "0", "sha256:" + "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef", " " + good, good[7:]} {
		if _, err := Parse(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse(%q) error = %v, want ErrMalformed", bad, err)
		}
	}
}
