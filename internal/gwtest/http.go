package gwtest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RawPost sends body to the MCP endpoint (in a fresh session unless sid).
func RawPost(t *testing.T, url, sid string, body []byte) (int, string) {
	t.Helper()
	resp, b := RawPostResp(t, url, sid, body)
	return resp.StatusCode, string(b)
}

// RawPostResp is RawPost with the whole response (its body read).
func RawPostResp(t *testing.T, url, sid string, body []byte) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// sampleLine is one sample of the Prometheus text format (no timestamps).
var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (\S+)$`)

// ParseExposition checks the text format line by line (every sample's
// family was declared with HELP and TYPE before it) and returns the samples
// as "name{labels}" -> value.
func ParseExposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	typed := map[string]string{}
	out := map[string]float64{}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "# HELP "):
		case strings.HasPrefix(line, "# TYPE "):
			f := strings.Fields(line)
			if len(f) != 4 {
				t.Fatalf("line %d: bad TYPE line %q", i+1, line)
			}
			if _, dup := typed[f[2]]; dup {
				t.Fatalf("line %d: family %s declared twice", i+1, f[2])
			}
			typed[f[2]] = f[3]
		default:
			m := sampleLine.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("line %d: not a valid sample: %q", i+1, line)
			}
			fam := m[1]
			if typed[fam] == "" {
				fam = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(fam, "_bucket"), "_sum"), "_count")
			}
			if typed[fam] == "" {
				t.Fatalf("line %d: sample %s before its TYPE", i+1, m[1])
			}
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				t.Fatalf("line %d: value %q: %v", i+1, m[3], err)
			}
			out[m[1]+m[2]] = v
		}
	}
	return out
}

// Certs makes a CA, a server certificate for 127.0.0.1 and a client
// certificate for subject CN=agent-7.
func Certs(t *testing.T) (ca *x509.CertPool, server, client tls.Certificate, caPEM []byte) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	ca = x509.NewCertPool()
	ca.AddCert(caCert)
	leaf := func(serial int64, subj pkix.Name, usage x509.ExtKeyUsage, ips []net.IP) tls.Certificate {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: subj, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}
	server = leaf(2, pkix.Name{CommonName: "cmcp"}, x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	client = leaf(3, pkix.Name{CommonName: "agent-7", Organization: []string{"acme"}}, x509.ExtKeyUsageClientAuth, nil)
	return ca, server, client, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}
