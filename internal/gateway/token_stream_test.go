package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// splitBearer sends one token on POSTs and another on GET streams.
type splitBearer struct{ post, get string }

func (b splitBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	tok := b.post
	if r.Method == http.MethodGet {
		tok = b.get
	}
	r.Header.Set("Authorization", "Bearer "+tok)
	return http.DefaultTransport.RoundTrip(r)
}

// TestWithdrawnTokenEndsTheGETStreamItOpened: a session's GET stream is
// authenticated once, when it opens, with any token of the identity. A
// SIGHUP that withdraws the token a stream was opened with ends the session
// (its stream included), even when the token that opened the session stays
// in force (found in review: only the opening token was checked).
func TestWithdrawnTokenEndsTheGETStreamItOpened(t *testing.T) {
	const tokA, tokB = "token-a-0123456789abcdef", "token-b-0123456789abcdef"
	initial := []Token{{Digest: TokenDigest(tokA), Identity: "alice"}, {Digest: TokenDigest(tokB), Identity: "alice"}}
	ts := NewTokenSet(initial)
	h := newHarness(t, hconf{tokens: initial, tokenSet: ts})
	got := make(chan struct{}, 10)
	hc := &http.Client{Transport: splitBearer{post: tokB, get: tokA}}
	c := mcp.NewClient(&mcp.Implementation{Name: "a", Version: "1"}, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { got <- struct{}{} }})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatal(err)
	}
	waitOne := func(d time.Duration) bool {
		stop := time.After(d)
		for {
			for _, s := range h.g.sessionList() {
				s.notifyToolsChanged()
			}
			select {
			case <-got:
				return true
			case <-time.After(100 * time.Millisecond):
			case <-stop:
				return false
			}
		}
	}
	if !waitOne(5 * time.Second) {
		t.Fatal("GET stream (token A) delivers nothing before the reload")
	}
	rt := &ReloadTargets{Tokens: ts}
	next := ReloadedTokens{Agents: []Token{{Identity: "alice", Digest: TokenDigest(tokB)}}}
	var restart []string
	if err := h.g.ReloadTokens(context.Background(), next, rt, &restart); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	for len(got) > 0 {
		<-got
	}
	if waitOne(2 * time.Second) {
		t.Fatalf("token A withdrawn on SIGHUP, yet the GET stream it opened still delivers (sessions alive: %d)", len(h.g.sessionList()))
	}
}
