package credential_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/credential"
)

// answer is the base transport of the benchmark: it answers every request
// at once in memory, so that what is measured is the gateway's own CPU
// (the upstream's answer costs both variants the same).
type answer struct{}

func (answer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Authorization") == "" {
		panic("no credential")
	}
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
}

// static is what a static bearer credential costs: the header put on a
// clone of each request (internal/upstream's credentialTransport).
type static struct {
	header http.Header
	base   http.RoundTripper
}

func (s static) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(s.header) == 0 {
		return s.base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	for k, v := range s.header {
		r.Header[k] = v
	}
	return s.base.RoundTrip(r)
}

// constSource mints one token per identity, for the benchmark's cache.
type constSource struct{}

func (constSource) Kind() string { return "exec" }
func (constSource) Mint(_ context.Context, r credential.Request) (credential.Token, error) {
	return credential.Token{Value: credential.NewSecret("tok-" + r.Identity.Name)}, nil
}

// BenchmarkCachedCredential: the CPU a call's request costs with a static
// credential and with a cached per-identity one (1000 identities in the
// cache); the difference is what per-identity credentials add (issue 19:
// under 5 us).
func BenchmarkCachedCredential(b *testing.B) {
	body := `{"jsonrpc":"2.0","id":"cmcp-1","method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	run := func(b *testing.B, rt http.RoundTripper) {
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://127.0.0.1:1/mcp", strings.NewReader(body))
			req.Header["Content-Type"] = []string{"application/json"}
			req.Header["Accept"] = []string{"application/json, text/event-stream"}
			req.Header["Mcp-Session-Id"] = []string{"0123456789abcdef"}
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
		}
	}
	b.Run("static", func(b *testing.B) {
		run(b, static{header: http.Header{"Authorization": {"Bearer tok-static"}}, base: answer{}})
	})
	b.Run("per-identity", func(b *testing.B) {
		br := credential.NewBroker("remote", constSource{}, credential.Options{})
		for i := range 1000 {
			if _, err := br.Get(context.Background(), credential.Identity{Name: "agent-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}); err != nil {
				b.Fatal(err)
			}
		}
		id := credential.Identity{Name: "alice"}
		// As in the gateway: the per-identity transport sits above the
		// static one (which then carries no Authorization).
		tr := &credential.Transport{Broker: br, Identity: id, Base: static{header: http.Header{}, base: answer{}}}
		run(b, tr)
	})
}

// BenchmarkBrokerGetCached is the part of a call a per-identity credential
// adds over a static one: the cache lookup of the identity's credential
// (1000 identities cached; the request clone both variants make is not in
// it). It is robust to a loaded machine where the two whole-request
// variants of BenchmarkCachedCredential drift apart by more than their
// difference.
func BenchmarkBrokerGetCached(b *testing.B) {
	br := credential.NewBroker("remote", constSource{}, credential.Options{})
	ctx := context.Background()
	ids := make([]credential.Identity, 1000)
	for i := range ids {
		ids[i] = credential.Identity{Name: "agent-" + strings.Repeat("x", i%40) + string(rune('a'+i%26)) + string(rune('a'+i/26%26))}
		if _, err := br.Get(ctx, ids[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := br.Get(ctx, ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
