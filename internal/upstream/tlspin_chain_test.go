package upstream

import (
	"crypto/tls"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestHTTPPinnedKeyFurtherUpTheChainRefused: with a pin, certificates are
// not verified (InsecureSkipVerify), so only the leaf counts: its key is
// the one the handshake proved the server holds. A server with a fresh key
// that sends the pinned certificate after its own leaf (anyone can copy a
// public certificate) is refused before any request, and the key named is
// the leaf's. Comparing the pin with the last certificate, or with any
// certificate of the chain, would let it through (found in review).
func TestHTTPPinnedKeyFurtherUpTheChainRefused(t *testing.T) {
	pinned := newTestCert(t)
	fresh := newTestCert(t)
	var reached atomic.Int64
	h := mcpServer(t, "")
	chain := testCert{
		tls: tls.Certificate{
			Certificate: [][]byte{fresh.leaf.Raw, pinned.leaf.Raw},
			PrivateKey:  fresh.tls.PrivateKey,
			Leaf:        fresh.leaf,
		},
		leaf: fresh.leaf,
	}
	srv := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		h.ServeHTTP(w, r)
	}), chain)
	want := SPKIDigest(pinned.leaf)
	up, err := NewHTTP(HTTPOptions{Name: "pinned", URL: srv.URL + "/mcp", TLSPin: want.String()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = callEcho(t, up)
	var pm *PinMismatchError
	if !errors.As(err, &pm) {
		t.Fatalf("err = %v, want a *PinMismatchError", err)
	}
	if !pm.Want.Equal(want) || !pm.Got.Equal(SPKIDigest(fresh.leaf)) {
		t.Fatalf("mismatch error names %s as the server's key, want the leaf's %s", pm.Got, SPKIDigest(fresh.leaf))
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d requests reached the server", n)
	}
}
