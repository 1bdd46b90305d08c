package digest

import (
	"encoding/json"
	"testing"
)

// rfc8785Example is the example of RFC 8785 section 3.2.2 and its canonical
// form from section 3.2.3.
const (
	rfc8785Example = `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	rfc8785Canonical = `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`
)

func TestCanonicalizeRFC8785Example(t *testing.T) {
	got, err := Canonicalize([]byte(rfc8785Example))
	if err != nil || string(got) != rfc8785Canonical {
		t.Fatalf("Canonicalize(RFC 8785 example) = %s, %v\nwant %s", got, err, rfc8785Canonical)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", // SHA-256 of ""
		"sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
		"sha512:cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce",
		"sha256:", "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := Parse(s)
		if err != nil {
			if !d.IsZero() {
				t.Fatal("error with a non-zero digest")
			}
			return
		}
		if d.String() != s {
			t.Fatalf("Parse(%q).String() = %q", s, d.String())
		}
		var d2 Digest
		if err := d2.UnmarshalText([]byte(s)); err != nil || !d2.Equal(d) {
			t.Fatalf("UnmarshalText(%q) = %v, %v", s, d2, err)
		}
	})
}

func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{
		rfc8785Example, rfc8785Canonical,
		`{"name":"read_file","description":"Read a file","inputSchema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}`,
		`{"a":1,"a":2}`, `[1e400]`, `9007199254740993`, `-0`, `"\ud800"`, `{"\u0000":null}`, "\"\xff\"", `[]`, `{}`, `1.0e-7`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := Canonicalize(in)
		if err != nil {
			return
		}
		if !json.Valid(c) {
			t.Fatalf("Canonicalize(%q) = %q: not valid JSON", in, c)
		}
		c2, err := Canonicalize(c)
		if err != nil || string(c2) != string(c) {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, c, c2, err)
		}
		if !IsCanonical(c) {
			t.Fatalf("IsCanonical(%q) = false", c)
		}
		d, err := JSON(in)
		if err != nil || !d.Equal(Bytes(c)) {
			t.Fatalf("JSON(%q) = %v, %v", in, d, err)
		}
	})
}
