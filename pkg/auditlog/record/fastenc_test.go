package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// awkwardStrings are strings whose canonical form is easy to get wrong.
var awkwardStrings = []string{
	"",
	"plain",
	`quote " backslash \ slash / <html> & 'single'`,
	"controls \x00\x01\x07\b\t\n\x0b\f\r\x0e\x1f\x7f end",
	"é ß 漢字 \u2028 \u2029 \ufeff \ufffd 😀 \U0010FFFF",
	"invalid \xff \xc3 \xed\xa0\x80 (surrogate) \xf4\x90\x80\x80 \xe2\x82 truncated",
	"\xc3",
	strings.Repeat("long ", 200),
}

var (
	sampleMAC    = bytes.Repeat([]byte{0xfb, 0xff, 0x3e}, 11)[:32]
	sampleDigest = digest.Bytes([]byte("bundle"))
)

// fastCases returns records of every kind, the ones with a fast encoder
// with awkward values in every member.
func fastCases() map[string]Record {
	cases := map[string]Record{
		"genesis":    &Genesis{Origin: "o", Epoch: 1, Key: "k", Created: time.Unix(1, 5).UTC(), Durability: DurabilityGroup, Extra: json.RawMessage(`{"b": 1, "a": "\u00e9"}`)},
		"segment":    &Segment{Number: 2, FirstIndex: 10, PrevFile: "seg-000001.jsonl", PrevSHA256: sampleMAC, Checkpoint: "n\n", Frontier: [][]byte{sampleMAC}},
		"checkpoint": &CheckpointRecord{Note: "o\n1\nroot\n\n— o sig\n"},
		"recovery":   &Recovery{Epoch: 1, Origin: "o", File: "f", Reason: "r\x00", DroppedSHA256: sampleMAC},
		"seal":       &Seal{Reason: "close", Records: 7},
		"spawn":      &Spawn{Upstream: "fs", Path: "/bin/é", EvidenceClass: "spawn-measured", Outcome: "started", Digest: sampleDigest, PID: 42, EnvNames: []string{"PATH", "é"}, Env: Commitment{ID: 7, Size: 12, MAC: sampleMAC}},
		"upstream":   &Upstream{Name: "fs", Transport: "stdio", EvidenceClass: "x", Event: "connected", Reason: "\xff"},
		"drift":      &Drift{Upstream: "fs", Tool: "t", Change: "changed", Action: "refused", Pin: sampleDigest},
		"session":    &Session{ID: "s", Event: "start", Agent: "a\u2028"},
		"stderr":     &Stderr{Upstream: "fs", Bytes: 1 << 40, Lines: -1},
		"policy":     &Policy{Event: "loaded", Bundle: sampleDigest, Reason: "\t"},
		"admin":      &Admin{Action: "checkpoint", Actor: "😀"},
		"machine": &Machine{Event: MachineRegistered, Upstream: "files", Machine: "lab-7", Name: "lab seven", TokenID: "tokens[0]", Attested: true, Class: "tunnel",
			Server: &MachineServer{Kind: "stdio", Command: "/usr/bin/srv", Pin: "sha256:00", Digest: "sha256:00", Class: "spawn-measured"}, Host: &MachineHost{Hostname: "lab7", OS: "linux", Arch: "amd64", CPUs: 8}, ConnectedMS: 1 << 40},
		"credential":  &CredentialMinted{Upstream: "gh", Identity: "alice@example.com", Source: "exec", Reason: "first", Expires: "2026-01-02T03:04:05Z", Fingerprint: "hmac-sha256:00"},
		"call/zero":   &Call{},
		"result/zero": &Result{},
		"call/minimal": &Call{Session: "s", Agent: "a", Tool: "t", Upstream: "u", EvidenceClass: "e", Decision: DecisionDeny,
			PolicyMode: "none", Outcome: OutcomeRefused, Reason: "unknown tool"},
		"call/empty-slices": &Call{PolicyIDs: []string{}, PolicyInput: &PolicyInput{Groups: []string{}, ToolsUsed: []string{}, Errors: []string{}}},
		"call/nil-slices":   &Call{PolicyInput: &PolicyInput{}},
		"call/machine": &Call{Session: "s", Agent: "a", Tool: "files__read", Upstream: "files", EvidenceClass: "tunnel", Machine: "lab-7",
			Decision: DecisionAllow, PolicyMode: "none", Outcome: OutcomeForwarded},
		"call/machine-policy-input": &Call{Session: "s", Agent: "a", Tool: "files__read", Upstream: "files", EvidenceClass: "tunnel", Machine: "lab-7",
			Decision: DecisionDeny, PolicyMode: "enforcing", Outcome: OutcomeRefused,
			PolicyInput: &PolicyInput{EvidenceClass: "tunnel", Machine: "lab-\u00e9\"7", Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}},
		"call/full": &Call{Session: "3f1c", Agent: "agent", RequestID: json.RawMessage(`17`), Tool: "fs__read", Upstream: "fs",
			UpstreamTool: "read", EvidenceClass: "spawn-measured", Args: Commitment{ID: 1<<62 + 3, Size: math.MaxInt64, MAC: sampleMAC},
			Decision: DecisionAllow, PolicyIDs: []string{"p0", "p1"}, PolicyMode: "enforcing", PolicyBundle: sampleDigest,
			Outcome: OutcomeForwarded, Reason: "r",
			PolicyInput: &PolicyInput{Groups: []string{"g"}, EvidenceClass: "e", Hints: ToolHints{true, true, true, true},
				SessionCalls: math.MinInt64, ToolsUsed: []string{"a", "b"}, Time: time.Date(2025, 1, 2, 3, 4, 5, 600_000_000, time.UTC),
				Errors: []string{"e1"}}},
		"call/commitment-without-mac": &Call{Args: Commitment{ID: 3, Size: 4}},
		"call/commitment-empty-mac":   &Call{Args: Commitment{ID: 3, Size: 4, MAC: []byte{}}},
		"call/time-zero":              &Call{PolicyInput: &PolicyInput{Time: time.Time{}}},
		"call/time-zone":              &Call{PolicyInput: &PolicyInput{Time: time.Date(2025, 1, 2, 3, 4, 5, 1, time.FixedZone("x", -(9*3600+30*60)))}},
		"call/time-zone-seconds":      &Call{PolicyInput: &PolicyInput{Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("lmt", 75))}},
		"call/time-zone-24h":          &Call{PolicyInput: &PolicyInput{Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("far", 25*3600))}},
		"call/time-zone-100h":         &Call{PolicyInput: &PolicyInput{Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("farther", 100*3600))}},
		"call/time-year-10000":        &Call{PolicyInput: &PolicyInput{Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}},
		"call/time-year-negative":     &Call{PolicyInput: &PolicyInput{Time: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}},
		"call/time-local":             &Call{PolicyInput: &PolicyInput{Time: time.Unix(1700000000, 123456789)}},
		"result/full": &Result{Call: 12, Session: "s", Outcome: ResultUpstreamError, Result: Commitment{ID: 0, Size: 0, MAC: sampleMAC},
			LatencyMicros: -5, ErrorCode: -32603, Reason: "internal error: \"x\"\n"},
		"result/nil":           (*Result)(nil),
		"session/zero":         &Session{},
		"session/nil":          (*Session)(nil),
		"session/empty-groups": &Session{ID: "s", Event: "start", Agent: "a", Groups: []string{}},
		"session/start": &Session{ID: "3f1c", Event: "start", Agent: "anonymous", Front: "http", ClientName: "claude-code", ClientVersion: "1.0",
			Protocol: "2025-06-18"},
		"session/full": &Session{ID: "s", Event: "token", Agent: "alice", Front: "stdio", ClientName: "c", ClientVersion: "v", Protocol: "p", Reason: "r",
			Issuer: "https://op.example", TokenID: "jti-1", Groups: []string{"ops", "dev", "ops"}},
		"upstream/zero": &Upstream{},
		"upstream/nil":  (*Upstream)(nil),
		"upstream/assigned": &Upstream{Name: "t", Transport: "stdio", Endpoint: "pid 4242", EvidenceClass: "spawn-measured", Session: "3f1c",
			Event: "assigned", Reason: "a warm spare, started and recorded before the session, now serves it alone"},
		"upstream/full": &Upstream{Name: "web", Transport: "http", Endpoint: "https://127.0.0.1:8443/mcp", EvidenceClass: "tls-pinned", SPKI: sampleDigest,
			ServerName: "srv", ServerVersion: "1.2.3", Tools: math.MaxInt64, Session: "s", Event: "connected", Reason: "r"},
		"upstream/tools-negative": &Upstream{Tools: math.MinInt64, Event: "connected"},
		"call/nil":                (*Call)(nil),
	}
	for i, s := range awkwardStrings {
		cases[fmt.Sprintf("call/string-%d", i)] = &Call{Session: s, Agent: s, Tool: s, Upstream: s, UpstreamTool: s, EvidenceClass: s,
			Decision: s, PolicyIDs: []string{s, s}, PolicyMode: s, Outcome: s, Reason: s,
			PolicyInput: &PolicyInput{Groups: []string{s}, EvidenceClass: s, ToolsUsed: []string{s}, Errors: []string{s}}}
		cases[fmt.Sprintf("result/string-%d", i)] = &Result{Session: s, Outcome: s, Reason: s}
		cases[fmt.Sprintf("session/string-%d", i)] = &Session{ID: s, Event: s, Agent: s, Front: s, ClientName: s, ClientVersion: s, Protocol: s,
			Reason: s, Issuer: s, TokenID: s, Groups: []string{s, s}}
		cases[fmt.Sprintf("upstream/string-%d", i)] = &Upstream{Name: s, Transport: s, Endpoint: s, EvidenceClass: s, ServerName: s, ServerVersion: s,
			Session: s, Event: s, Reason: s}
	}
	for _, id := range []string{``, `0`, `-1`, `9007199254740992`, `9007199254740993`, `-9007199254740993`, `1.5`, `1e3`, `-0`, `01`,
		`"id"`, `"\u00e9"`, `"é"`, `"\/"`, `"a\nb"`, `"\u000a"`, `null`, `true`, `{"b":1,"a":2}`, `[1,2]`, ` 7`, `7 `, `"unterminated`,
		"\"\xff\"", `{}`, `"\ud800"`} {
		cases["call/request-id-"+id] = &Call{Session: "s", RequestID: json.RawMessage(id)}
	}
	cases["call/request-id-empty-non-nil"] = &Call{RequestID: json.RawMessage{}}
	return cases
}

// TestFastEncoding checks that the one-pass encoders of call, result,
// session and upstream records write exactly the bytes of the general path (marshal,
// canonicalize, scan), and that the general path decides every case the
// fast path leaves to it (errors included).
func TestFastEncoding(t *testing.T) {
	for name, r := range fastCases() {
		t.Run(name, func(t *testing.T) {
			want, werr := encodeBodyGeneral(r)
			got, gerr := EncodeBody(r)
			if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
				t.Fatalf("error: fast path %v, general path %v", gerr, werr)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("fast path differs from the general path:\nfast    %s\ngeneral %s", got, want)
			}
			// With a prefix already in the buffer, only the body is appended.
			pre := []byte("prefix")
			got2, _ := AppendBody(pre, r)
			if werr == nil && !bytes.Equal(got2, append([]byte("prefix"), want...)) {
				t.Fatalf("appendBody with a prefix: %q", got2)
			}
		})
	}
}

// TestFastEncodingIsUsed keeps the fast path honest: the gateway's records
// must not fall back to the general path silently.
func TestFastEncodingIsUsed(t *testing.T) {
	c := fastCases()
	for _, name := range []string{"call/full", "call/minimal", "call/machine", "result/full", "call/time-local", "call/string-4", "call/string-5",
		"upstream/assigned", "upstream/full", "upstream/zero", "upstream/string-5",
		"session/start", "session/full", "session/zero", "session/string-5"} {
		if _, ok := appendFastBody(nil, c[name]); !ok {
			t.Errorf("%s: fast path not taken", name)
		}
	}
	for _, name := range []string{"call/time-year-10000", "call/request-id-1.5", "call/request-id-null", "call/nil", "upstream/nil", "session/nil"} {
		if _, ok := appendFastBody(nil, c[name]); ok {
			t.Errorf("%s: fast path taken for a value it must leave to the general path", name)
		}
	}
}

// FuzzFastEncoding compares the fast and general encoders on arbitrary
// strings, ids, integers and times.
func FuzzFastEncoding(f *testing.F) {
	for i, s := range awkwardStrings {
		f.Add(s, "17", int64(i), int64(1700000000+i), int64(i*1000), int32(0))
	}
	f.Add("x", `"id"`, int64(-1), int64(-62135596800), int64(0), int32(3600))
	f.Add("x", `1e2`, int64(math.MaxInt64), int64(253402300800), int64(999999999), int32(-86399))
	f.Fuzz(func(t *testing.T, s, id string, n, sec, nsec int64, zone int32) {
		tm := time.Unix(sec, nsec).In(time.FixedZone("z", int(zone)))
		recs := []Record{
			&Call{Session: s, Agent: s, RequestID: json.RawMessage(id), Tool: s, Upstream: s, EvidenceClass: s, Decision: s,
				Args: Commitment{ID: n, Size: n, MAC: []byte(s)}, PolicyIDs: []string{s}, PolicyMode: s, Outcome: s, Reason: s, UpstreamTool: s, Machine: s,
				PolicyInput: &PolicyInput{Groups: []string{s}, EvidenceClass: s, SessionCalls: n, ToolsUsed: []string{s}, Time: tm, Errors: []string{s}}},
			&Result{Call: n, Session: s, Outcome: s, Result: Commitment{ID: n, Size: n, MAC: []byte(s)}, LatencyMicros: n, ErrorCode: n, Reason: s},
			&Upstream{Name: s, Transport: s, Endpoint: s, EvidenceClass: s, SPKI: digest.Bytes([]byte(s)), ServerName: s, ServerVersion: s, Tools: n,
				Session: s, Event: s, Reason: s},
			&Session{ID: s, Event: s, Agent: s, Front: s, ClientName: s, ClientVersion: s, Protocol: s, Reason: s, Issuer: s, TokenID: s, Groups: []string{s}},
		}
		for _, r := range recs {
			want, werr := encodeBodyGeneral(r)
			got, gerr := EncodeBody(r)
			if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
				t.Fatalf("%s: error: fast path %v, general path %v", r.Kind(), gerr, werr)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: fast path differs:\nfast    %q\ngeneral %q", r.Kind(), got, want)
			}
		}
	})
}
