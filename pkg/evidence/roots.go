package evidence

import (
	"bytes"
	"crypto/x509"
	"embed"
	"encoding/pem"
	"errors"
	"fmt"
	"sort"
	"strings"
)

//go:embed roots/*.pem
var rootFiles embed.FS

// EmbeddedSource names the roots compiled into cmcp.
const EmbeddedSource = "embedded"

// amdRoots are one AMD product line's anchors: the self-signed ARK, the ASK
// (signs VCEKs) and the ASVK (signs VLEKs).
type amdRoots struct{ ark, ask, asvk *x509.Certificate }

// Roots are the trust anchors verification accepts: per AMD product line the
// ARK with its ASK (VCEK chain) and ASVK (VLEK chain), and the Intel SGX root
// CA for TDX PCK chains. A root carried by the evidence itself is never used.
type Roots struct {
	// Source is EmbeddedSource or the file the roots were read from.
	Source string
	amd    map[string]*amdRoots
	intel  *x509.CertPool
	// intelCerts are the certificates in intel, to name the one a chain used.
	intelCerts []*x509.Certificate
	// Names lists the anchors for people ("AMD ARK-Milan", "Intel SGX Root CA").
	Names []string
}

// Embedded returns the vendor roots compiled into cmcp (pkg/evidence/roots):
// the AMD ARK, ASK and ASVK of Milan, Genoa and Turin as published by AMD KDS
// (the copies go-sev-guest v0.15.0 ships), and the Intel SGX Root CA.
func Embedded() *Roots {
	var all []byte
	entries, err := rootFiles.ReadDir("roots")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		data, err := rootFiles.ReadFile("roots/" + e.Name())
		if err != nil {
			panic(err)
		}
		all = append(append(all, bytes.TrimSpace(data)...), '\n')
	}
	r, err := ParseRoots(all, EmbeddedSource)
	if err != nil {
		panic(fmt.Sprintf("embedded roots: %v", err))
	}
	return r
}

// ParseRoots reads replacement roots from PEM (or a single DER certificate):
// for AMD, each product line's self-signed ARK ("ARK-<line>") with its ASK
// ("SEV-<line>") and/or ASVK ("SEV-VLEK-<line>"), as in AMD KDS cert_chain
// files; for Intel, self-signed CA certificates. The result replaces the
// embedded roots entirely.
func ParseRoots(data []byte, source string) (*Roots, error) {
	certs, err := ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificates found")
	}
	r := &Roots{Source: source, amd: map[string]*amdRoots{}, intel: x509.NewCertPool()}
	get := func(line string) *amdRoots {
		if r.amd[line] == nil {
			r.amd[line] = &amdRoots{}
		}
		return r.amd[line]
	}
	set := func(slot **x509.Certificate, c *x509.Certificate, i int) error {
		if *slot != nil && !(*slot).Equal(c) {
			return fmt.Errorf("certificate %d (%q): a different certificate with this name came before", i+1, c.Subject.CommonName)
		}
		*slot = c
		return nil
	}
	for i, c := range certs {
		cn := c.Subject.CommonName
		var err error
		switch {
		case strings.HasPrefix(cn, "ARK-"):
			err = set(&get(strings.TrimPrefix(cn, "ARK-")).ark, c, i)
		case strings.HasPrefix(cn, "SEV-VLEK-"):
			err = set(&get(strings.TrimPrefix(cn, "SEV-VLEK-")).asvk, c, i)
		case strings.HasPrefix(cn, "SEV-") && c.IsCA:
			err = set(&get(strings.TrimPrefix(cn, "SEV-")).ask, c, i)
		case c.IsCA && bytes.Equal(c.RawIssuer, c.RawSubject):
			if err := c.CheckSignatureFrom(c); err != nil {
				return nil, fmt.Errorf("certificate %d (%q): self-signed root whose signature does not verify: %v", i+1, cn, err)
			}
			r.intel.AddCert(c)
			r.intelCerts = append(r.intelCerts, c)
			r.Names = append(r.Names, cn)
		default:
			return nil, fmt.Errorf("certificate %d (%q) is neither an AMD ARK/ASK/ASVK nor a self-signed root CA", i+1, cn)
		}
		if err != nil {
			return nil, err
		}
	}
	lines := make([]string, 0, len(r.amd))
	for l := range r.amd {
		lines = append(lines, l)
	}
	sort.Strings(lines)
	for _, l := range lines {
		s := r.amd[l]
		if s.ark == nil || (s.ask == nil && s.asvk == nil) {
			return nil, fmt.Errorf("AMD %s: need the ARK and an ASK or ASVK (the KDS cert_chain file has both)", l)
		}
		if err := s.ark.CheckSignatureFrom(s.ark); err != nil {
			return nil, fmt.Errorf("AMD ARK-%s is not self-signed: %v", l, err)
		}
		for _, ica := range []*x509.Certificate{s.ask, s.asvk} {
			if ica != nil {
				if err := ica.CheckSignatureFrom(s.ark); err != nil {
					return nil, fmt.Errorf("AMD %s is not signed by ARK-%s: %v", ica.Subject.CommonName, l, err)
				}
			}
		}
		what := "VCEK"
		switch {
		case s.ask != nil && s.asvk != nil:
			what = "VCEK and VLEK"
		case s.asvk != nil:
			what = "VLEK"
		}
		r.Names = append(r.Names, fmt.Sprintf("AMD ARK-%s (%s)", l, what))
	}
	return r, nil
}

// ParseCertificates reads PEM "CERTIFICATE" blocks, or one DER certificate.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	trimmed := bytes.TrimSpace(data)
	if !bytes.HasPrefix(trimmed, []byte("-----BEGIN")) {
		c, err := x509.ParseCertificate(data)
		if err != nil {
			return nil, fmt.Errorf("neither PEM nor a DER certificate: %v", err)
		}
		return []*x509.Certificate{c}, nil
	}
	var out []*x509.Certificate
	rest := trimmed
	for len(bytes.TrimSpace(rest)) > 0 {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return nil, fmt.Errorf("PEM block %d: not PEM", len(out)+1)
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is %q, want CERTIFICATE", len(out)+1, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %v", len(out)+1, err)
		}
		out = append(out, c)
	}
	return out, nil
}
