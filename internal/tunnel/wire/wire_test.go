package wire

import (
	"bytes"
	"crypto/tls"
	"strings"
	"testing"
)

var vectors = []string{
	`{"t":"hello","nonce":"00112233445566778899aabbccddeeff"}`,
	`{"t":"evidence","bundle":{"format":"cmcp-evidence/v1"}}`,
	`{"t":"register","register":{"token":"tok","upstream":"files","machine_id":"lab-7","name":"lab seven","version":"devel","server":{"kind":"stdio","command":"/usr/bin/srv","pin":"sha256:aeebad4a796fcc2e8f6a1cb2f1ea7ffd5a8bfd4d9d0d67a4cfe4b0acdd8b5df9","digest":"sha256:aeebad4a796fcc2e8f6a1cb2f1ea7ffd5a8bfd4d9d0d67a4cfe4b0acdd8b5df9","class":"spawn-measured"},"host":{"hostname":"lab7","os":"linux","arch":"amd64","cpus":8,"load1":0.5,"sessions":0}}}`,
	`{"t":"registered","heartbeat_ms":15000}`,
	`{"t":"refused","code":"unauthorized","reason":"bad token"}`,
	`{"t":"heartbeat","host":{"hostname":"h","os":"linux","arch":"amd64","cpus":2,"load1":0,"sessions":3}}`,
	`{"t":"open","s":"s-1"}`,
	`{"t":"opened","s":"s-1"}`,
	`{"t":"msg","s":"s-1","m":{"jsonrpc":"2.0","id":1,"method":"tools/list"}}`,
	`{"t":"close","s":"s-1","reason":"agent session ended"}`,
	`{"t":"closed","s":"s-1","reason":"child exited"}`,
}

func TestDecodeVectors(t *testing.T) {
	for _, v := range vectors {
		f, err := Decode([]byte(v))
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		g, err := Decode(Encode(f))
		if err != nil {
			t.Fatalf("re-decode %s: %v", Encode(f), err)
		}
		if !bytes.Equal(Encode(f), Encode(g)) {
			t.Fatalf("round trip changed %s to %s", Encode(f), Encode(g))
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"unknown field", `{"t":"open","s":"a","x":1}`, "unknown field"},
		{"unknown type", `{"t":"nope"}`, "unknown frame type"},
		{"no session", `{"t":"msg","m":{}}`, "session id"},
		{"session with space", `{"t":"open","s":"a b"}`, "session id"},
		{"message not object", `{"t":"msg","s":"a","m":[1]}`, "not a JSON-RPC message object"},
		{"trailing data", `{"t":"open","s":"a"} {}`, "after its object"},
		{"bad machine id", `{"t":"register","register":{"token":"x","upstream":"u","machine_id":"../x","server":{"kind":"stdio"}}}`, "machine id"},
		{"control in name", `{"t":"register","register":{"token":"x","upstream":"u","machine_id":"m","name":"a\u001b[2J","server":{"kind":"stdio"}}}`, "name must be printable"},
		{"bad kind", `{"t":"register","register":{"token":"x","upstream":"u","machine_id":"m","server":{"kind":"ssh"}}}`, "neither stdio nor http"},
		{"no token", `{"t":"register","register":{"upstream":"u","machine_id":"m","server":{"kind":"stdio"}}}`, "token"},
		{"short nonce", `{"t":"hello","nonce":"00"}`, "nonce"},
		{"heartbeat without host", `{"t":"heartbeat"}`, "no host"},
		{"over the limit", `{"t":"msg","s":"a","m":{"x":"` + strings.Repeat("a", MaxFrame) + `"}}`, "over the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestEncodeMsgIsAMsgFrame(t *testing.T) {
	m := []byte(`{"jsonrpc":"2.0","id":"x","result":{}}`)
	f, err := Decode(EncodeMsg(`s"1`, m))
	if err == nil {
		t.Fatalf("a session id with a quote decoded: %+v", f)
	}
	f, err = Decode(EncodeMsg("s1", m))
	if err != nil || f.T != TMsg || f.S != "s1" || !bytes.Equal(f.M, m) {
		t.Fatalf("Decode(EncodeMsg) = %+v, %v", f, err)
	}
}

func TestChannelStatementNeedsTLS13(t *testing.T) {
	if _, err := ChannelStatement(nil); err == nil || !strings.Contains(err.Error(), "https://") {
		t.Fatalf("no TLS: %v", err)
	}
	if _, err := ChannelStatement(&tls.ConnectionState{Version: tls.VersionTLS12}); err == nil || !strings.Contains(err.Error(), "1.3") {
		t.Fatalf("TLS 1.2: %v", err)
	}
	a, b := ChannelStatementOf([]byte("one")), ChannelStatementOf([]byte("two"))
	if a.Equal(b) {
		t.Fatal("two exporters give one statement")
	}
}

// FuzzDecode: Decode never panics, and what it accepts re-encodes to a
// frame it accepts again, unchanged.
func FuzzDecode(f *testing.F) {
	for _, v := range vectors {
		f.Add([]byte(v))
	}
	f.Add([]byte(`{"t":"msg","s":"7","m":{"jsonrpc":"2.0","id":"cmcp-1","result":{"a":[1,"\u00e9"]}}}`))
	f.Add([]byte(`{"t":"msg","s":"7","m":{"a":1,"a":2}}`))
	f.Add([]byte(`{"t":"msg","s":"7","m":{"a":1}} }`))
	f.Fuzz(func(t *testing.T, b []byte) {
		// The msg fast path accepts only what the strict decoder accepts,
		// and gives the same frame.
		if fast, ok := decodeMsg(b); ok {
			slow, err := decodeSlow(b)
			if err != nil {
				t.Fatalf("the msg fast path accepted %q, the strict decoder refuses it: %v", b, err)
			}
			if fast.S != slow.S || !bytes.Equal(fast.M, slow.M) || fast.T != slow.T {
				t.Fatalf("fast %+v, strict %+v for %q", fast, slow, b)
			}
		}
		fr, err := Decode(b)
		if err != nil {
			return
		}
		enc := Encode(fr)
		g, err := Decode(enc)
		if err != nil {
			t.Fatalf("accepted %q but not its encoding %q: %v", b, enc, err)
		}
		if !bytes.Equal(enc, Encode(g)) {
			t.Fatalf("round trip changed %q", enc)
		}
	})
}

// BenchmarkDecodeMsg: a call's answer in a msg frame, through Decode (the
// msg fast path) and through the strict decoder alone.
func BenchmarkDecodeMsg(b *testing.B) {
	frame := EncodeMsg("42", []byte(`{"jsonrpc":"2.0","id":"cmcp-17","result":{"content":[{"type":"text","text":"{\"q\":\"hello\"}"}],"structuredContent":{"q":"hello"}}}`))
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := Decode(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("strict", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeSlow(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
}
