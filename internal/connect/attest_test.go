package connect

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/tee"
	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// attestedGateway is a hub on TLS that answers hello with software
// evidence bound to the TLS channel.
func attestedGateway(t *testing.T) (*tunnel.Hub, *httptest.Server) {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	prov := tee.NewSoftware(nil)
	hub, err := tunnel.New(tunnel.Options{
		Upstreams: []tunnel.Upstream{{Name: "files", Tokens: []tunnel.Token{{SHA256: tokenSum(testToken)}}}},
		Attest: func(ctx context.Context, nonce []byte, st digest.Digest) ([]byte, error) {
			b, err := prov.Attest(ctx, pub, nonce, st)
			if err != nil {
				return nil, err
			}
			return b.Marshal()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(hub)
	srv.EnableHTTP2 = false
	srv.StartTLS()
	t.Cleanup(func() { srv.Close(); hub.Close() })
	return hub, srv
}

func reference(t *testing.T) *evidence.ReferenceValues {
	rv, err := evidence.ParseReferenceValues([]byte(`{"sev-snp":{"measurements":["` + strings.Repeat("ab", 48) + `"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	return rv
}

func trusting(srvs ...*httptest.Server) *tls.Config {
	pool := x509.NewCertPool()
	for _, s := range srvs {
		pool.AddCert(s.Certificate())
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
}

func firstState(t *testing.T, states chan State) State {
	t.Helper()
	select {
	case s := <-states:
		return s
	case <-time.After(60 * time.Second):
		t.Fatal("no state")
		return State{}
	}
}

// TestAttestedRegistersAfterVerifying: --require-attested with
// --allow-software registers with a gateway whose evidence binds this TLS
// channel and the connector's nonce.
func TestAttestedRegistersAfterVerifying(t *testing.T) {
	hub, srv := attestedGateway(t)
	states, _ := runConnector(t, Options{Gateway: srv.URL, MachineID: "lab-1", Stdio: serverSpec(t, "x"), TLS: trusting(srv),
		RequireAttested: true, Reference: reference(t), AllowSoftware: true})
	if s := firstState(t, states); s.Kind != "registered" {
		t.Fatalf("%+v, want registered", s)
	}
	waitMachines(t, hub, "lab-1")
	if !hub.Machine("files", "lab-1").Attested {
		t.Fatal("the machine is not recorded as having checked the gateway")
	}
}

// TestSoftwareEvidenceRefused: without --allow-software the software
// provider's evidence is refused, and the token is never sent.
func TestSoftwareEvidenceRefused(t *testing.T) {
	hub, srv := attestedGateway(t)
	states, _ := runConnector(t, Options{Gateway: srv.URL, MachineID: "lab-1", Stdio: serverSpec(t, "x"), TLS: trusting(srv),
		RequireAttested: true, Reference: reference(t)})
	s := firstState(t, states)
	var ve *VerifyError
	if !errors.As(s.Err, &ve) || !strings.Contains(s.Err.Error(), "software") {
		t.Fatalf("%+v, want a verification error naming software evidence", s)
	}
	if len(hub.Machines("files")) != 0 {
		t.Fatal("registered anyway")
	}
}

// TestProxyCannotPassOnEvidence: a TLS-terminating proxy between the
// connector and the gateway (which the connector trusts) relays the
// gateway's evidence, but it is bound to the proxy's other TLS session:
// the connector refuses to register.
func TestProxyCannotPassOnEvidence(t *testing.T) {
	hub, gw := attestedGateway(t)
	target, _ := url.Parse(gw.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: trusting(gw)}
	proxy := httptest.NewUnstartedServer(rp)
	proxy.EnableHTTP2 = false
	proxy.StartTLS()
	t.Cleanup(proxy.Close)
	states, _ := runConnector(t, Options{Gateway: proxy.URL, MachineID: "lab-1", Stdio: serverSpec(t, "x"), TLS: trusting(proxy, gw),
		RequireAttested: true, Reference: reference(t), AllowSoftware: true})
	s := firstState(t, states)
	var ve *VerifyError
	if !errors.As(s.Err, &ve) || !strings.Contains(s.Err.Error(), "statement") {
		t.Fatalf("%+v, want a verification error on the bound statement", s)
	}
	if len(hub.Machines("files")) != 0 {
		t.Fatal("registered through the proxy")
	}
	// The same proxy without attestation works: the refusal above is the
	// binding, not a broken proxy.
	runConnector(t, Options{Gateway: proxy.URL, MachineID: "lab-2", Stdio: serverSpec(t, "x"), TLS: trusting(proxy, gw)})
	waitMachines(t, hub, "lab-2")
}
