package evidence

import (
	"bytes"
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/google/go-sev-guest/verify/trust"
)

//go:embed roots/intel_sgx_root.pem
var intelSGXRootPEM []byte

// EmbeddedSource names the roots compiled into cmcp.
const EmbeddedSource = "embedded"

// Roots are the trust anchors verification accepts: per AMD product line the
// ARK with its ASK (VCEK chain) and ASVK (VLEK chain), and the Intel SGX root
// CA for TDX PCK chains. A root carried by the evidence itself is never used.
type Roots struct {
	// Source is EmbeddedSource or the file the roots were read from.
	Source string
	amd    map[string][]*trust.AMDRootCerts
	intel  *x509.CertPool
	nIntel int
	// Names lists the anchors for people ("ARK-Milan (VCEK+VLEK)", "Intel SGX Root CA").
	Names []string
}

// Embedded returns the vendor roots compiled into cmcp: the AMD ARK, ASK and
// ASVK of Milan, Genoa and Turin as shipped by go-sev-guest (from AMD KDS),
// and the Intel SGX Root CA.
func Embedded() *Roots {
	r := &Roots{Source: EmbeddedSource, amd: map[string][]*trust.AMDRootCerts{}, intel: x509.NewCertPool()}
	lines := []struct {
		name       string
		vcek, vlek []byte
	}{
		{"Milan", trust.AskArkMilanVcekBytes, trust.AskArkMilanVlekBytes},
		{"Genoa", trust.AskArkGenoaVcekBytes, trust.AskArkGenoaVlekBytes},
		{"Turin", trust.AskArkTurinVcekBytes, trust.AskArkTurinVlekBytes},
	}
	for _, l := range lines {
		vcek, vlek := &trust.ProductCerts{}, &trust.ProductCerts{}
		// The embedded Turin VLEK PEM ends in "\r\n\r\n", which the KDS parser rejects untrimmed.
		if err := vcek.FromKDSCertBytes(bytes.TrimSpace(l.vcek)); err != nil {
			panic(fmt.Sprintf("embedded AMD %s VCEK roots: %v", l.name, err))
		}
		if err := vlek.FromKDSCertBytes(bytes.TrimSpace(l.vlek)); err != nil {
			panic(fmt.Sprintf("embedded AMD %s VLEK roots: %v", l.name, err))
		}
		if !vcek.Ark.Equal(vlek.Ark) {
			panic(fmt.Sprintf("embedded AMD %s: VCEK and VLEK chains have different ARKs", l.name))
		}
		root := trust.AMDRootCertsProduct(l.name)
		root.ProductCerts = &trust.ProductCerts{Ark: vcek.Ark, Ask: vcek.Ask, Asvk: vlek.Asvk}
		r.amd[l.name] = []*trust.AMDRootCerts{root}
		r.Names = append(r.Names, fmt.Sprintf("AMD ARK-%s (VCEK and VLEK)", l.name))
	}
	blk, _ := pem.Decode(intelSGXRootPEM)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		panic(fmt.Sprintf("embedded Intel SGX root: %v", err))
	}
	r.intel.AddCert(c)
	r.nIntel++
	r.Names = append(r.Names, c.Subject.CommonName)
	return r
}

// ParseRoots reads replacement roots from PEM (or a single DER certificate):
// for AMD, each product line's self-signed ARK ("ARK-<line>") with its ASK
// ("SEV-<line>") and/or ASVK ("SEV-VLEK-<line>"); for Intel, self-signed CA
// certificates. The result replaces the embedded roots entirely.
func ParseRoots(data []byte, source string) (*Roots, error) {
	certs, err := ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificates found")
	}
	r := &Roots{Source: source, amd: map[string][]*trust.AMDRootCerts{}, intel: x509.NewCertPool()}
	type amdSet struct{ ark, ask, asvk *x509.Certificate }
	sets := map[string]*amdSet{}
	get := func(line string) *amdSet {
		if sets[line] == nil {
			sets[line] = &amdSet{}
		}
		return sets[line]
	}
	for i, c := range certs {
		cn := c.Subject.CommonName
		switch {
		case strings.HasPrefix(cn, "ARK-"):
			get(strings.TrimPrefix(cn, "ARK-")).ark = c
		case strings.HasPrefix(cn, "SEV-VLEK-"):
			get(strings.TrimPrefix(cn, "SEV-VLEK-")).asvk = c
		case strings.HasPrefix(cn, "SEV-") && c.IsCA:
			get(strings.TrimPrefix(cn, "SEV-")).ask = c
		case c.IsCA && bytes.Equal(c.RawIssuer, c.RawSubject):
			if err := c.CheckSignatureFrom(c); err != nil {
				return nil, fmt.Errorf("certificate %d (%q): self-signed root whose signature does not verify: %v", i+1, cn, err)
			}
			r.intel.AddCert(c)
			r.nIntel++
			r.Names = append(r.Names, cn)
		default:
			return nil, fmt.Errorf("certificate %d (%q) is neither an AMD ARK/ASK/ASVK nor a self-signed root CA", i+1, cn)
		}
	}
	lines := make([]string, 0, len(sets))
	for l := range sets {
		lines = append(lines, l)
	}
	sort.Strings(lines)
	for _, l := range lines {
		s := sets[l]
		if s.ark == nil || (s.ask == nil && s.asvk == nil) {
			return nil, fmt.Errorf("AMD %s: need the ARK and an ASK or ASVK (the KDS cert_chain file has both)", l)
		}
		root := trust.AMDRootCertsProduct(l)
		root.ProductCerts = &trust.ProductCerts{Ark: s.ark, Ask: s.ask, Asvk: s.asvk}
		r.amd[l] = []*trust.AMDRootCerts{root}
		r.Names = append(r.Names, "AMD ARK-"+l)
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
