package httpfront

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCertIdentityWithControlCharactersRefused: a verified client
// certificate whose subject holds a control character (a NUL in its CN)
// is refused as an identity, not passed on to the log and the policy.
func TestCertIdentityWithControlCharactersRefused(t *testing.T) {
	r := httptest.NewRequest("POST", "https://127.0.0.1/mcp", nil)
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "bob\x00ops"}}
	r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}
	if who, _, err := authenticate(r, Options{ClientCerts: true}); err == nil || !strings.Contains(err.Error(), "control characters") {
		t.Fatalf("identity %q, err %v", who, err)
	}
	cert.Subject.CommonName = "bob"
	if who, _, err := authenticate(r, Options{ClientCerts: true}); err != nil || who != "cert:CN=bob" {
		t.Fatalf("identity %q, err %v", who, err)
	}
}
