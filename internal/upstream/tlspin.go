package upstream

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// SPKIDigest returns the pin of a certificate's public key: SHA-256 over the
// DER of its SubjectPublicKeyInfo, written "sha256:<hex>". This is what a
// `tls_pin` in the config holds. (`openssl x509 -pubkey -noout -in cert.pem |
// openssl pkey -pubin -outform der | sha256sum` computes the same value.)
func SPKIDigest(cert *x509.Certificate) digest.Digest {
	return digest.FromSum(sha256.Sum256(cert.RawSubjectPublicKeyInfo))
}

// ParsePin reads a `tls_pin` value: "sha256:" and 64 lowercase hex digits of
// the SPKI digest.
func ParsePin(s string) (digest.Digest, error) {
	d, err := digest.Parse(s)
	if err != nil {
		return digest.Digest{}, fmt.Errorf("tls_pin: %w (want sha256:<64 hex> of the server certificate's SubjectPublicKeyInfo)", err)
	}
	return d, nil
}

// PinMismatchError reports that an HTTPS upstream presented a key other than
// the pinned one. The connection was closed before any request was sent.
type PinMismatchError struct {
	Upstream string
	Want     digest.Digest
	Got      digest.Digest
}

func (e *PinMismatchError) Error() string {
	return fmt.Sprintf("upstream %q: TLS public key %s does not match tls_pin %s; refusing the connection "+
		"(if the server's key was rotated on purpose, set tls_pin to the new value after checking it out of band)",
		e.Upstream, e.Got, e.Want)
}

// ExitCode makes cli.Main exit with exitcode.ExitMismatch (5) for a pin mismatch.
func (e *PinMismatchError) ExitCode() int { return 5 }

// ErrNoPeerCertificate is returned when a TLS peer sent no certificate at all.
var ErrNoPeerCertificate = errors.New("the server sent no certificate")

// pinVerifier checks the leaf certificate of every handshake against a pin
// and remembers the last key it accepted. A refused key is never recorded:
// it is in the *PinMismatchError of the request that met it, and nowhere
// else.
type pinVerifier struct {
	upstream string
	want     digest.Digest // zero: CA verification only, just observe

	mu   sync.Mutex
	seen digest.Digest
}

// verify is a tls.Config.VerifyConnection callback. Only the leaf counts: its
// key is the one the handshake proved possession of. Pinning a certificate
// further up an unverified chain would prove nothing, because a peer can send
// any certificate it likes there.
func (p *pinVerifier) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("upstream %q: %w", p.upstream, ErrNoPeerCertificate)
	}
	got := SPKIDigest(cs.PeerCertificates[0])
	if !p.want.IsZero() && !p.want.Equal(got) {
		return &PinMismatchError{Upstream: p.upstream, Want: p.want, Got: got}
	}
	// Without a pin the chain was verified already (VerifyConnection runs
	// after it): this key is accepted too.
	p.mu.Lock()
	p.seen = got
	p.mu.Unlock()
	return nil
}

func (p *pinVerifier) lastSeen() digest.Digest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen
}

// pinnedTLSConfig returns a client TLS config that accepts exactly the
// pinned key. The CA chain and host name are not consulted: the pin replaces
// them (a self-signed server is fine), so a valid certificate for another key
// is refused even if a public CA signed it.
func pinnedTLSConfig(v *pinVerifier, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         serverName,
		InsecureSkipVerify: true, // replaced by VerifyConnection: the leaf's SPKI must equal the pin
		VerifyConnection:   v.verify,
	}
}

// caTLSConfig returns a client TLS config with ordinary chain and host name
// verification against roots (nil: the system pool), observing the key.
func caTLSConfig(v *pinVerifier, serverName string, roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS12,
		ServerName:       serverName,
		RootCAs:          roots,
		VerifyConnection: v.verify,
	}
}
