// Package evidence defines cmcp's evidence classes and gateway platforms, the
// binding of a key to hardware attestation evidence, the versioned JSON
// evidence bundle, and the offline verification of SEV-SNP reports and TDX
// quotes against pinned vendor roots.
//
// # Binding
//
// The 64-byte report data of a SEV-SNP report (REPORT_DATA) or TDX quote
// (REPORTDATA) produced by cmcp is
//
//	SHA-512( "cmcp-attest-binding-v1" || 0x00
//	         || u32be(len(alg))  || alg        // "ed25519"
//	         || u32be(len(key))  || key        // the 32-byte Ed25519 public key
//	         || u32be(len(nonce))|| nonce      // the verifier's nonce, 0..1024 bytes
//	         || u32be(len(stmt)) || stmt )     // ASCII "sha256:<64 hex>", or empty
//
// where u32be is a 4-byte big-endian length and stmt is the statement digest
// in its text form (for the gateway: the digest of the audit log's genesis
// record without its evidence). Every field is length-prefixed, so no two
// different (alg, key, nonce, statement) tuples encode to the same bytes.
// [ReportData] computes it; the domain string is [BindingDomain]. Test
// vector: key 32 bytes of 0x11, nonce de ad be ef, statement = SHA-256 of
// "genesis" (sha256:aeebad4a...) give report data d0b0288d95bb1fc6...
// (full value in binding_test.go).
//
// # Bundle
//
// A [Bundle] is a JSON document with "format": "cmcp-evidence/v1": the
// platform, the binding inputs (key, nonce, statement, report data), and the
// raw evidence (the SNP report followed by its certificate table, or the TDX
// quote v4 with its embedded PCK chain) plus any extra certificates. A
// "software" bundle has no evidence: it is unattested, for development only,
// and never verifies as hardware.
//
// # Verification
//
// [Verify] and [VerifyRaw] check evidence offline: the vendor signature chain
// against roots embedded in this package (AMD Milan, Genoa and Turin ARK with
// ASK and ASVK; the Intel SGX Root CA) or explicitly supplied ones, never a
// root carried by the evidence; the report signature; the binding; the nonce;
// and reference values. Each check is a [Claim] with an EAR-like [Status]; the
// worst status is the verdict. The report formats are parsed with
// go-sev-guest and go-tdx-guest (abi, kds, pcs, validate); the signature and
// chain checks follow those libraries' verify packages (tests hold the two to
// the same verdicts) but are done here, so that the package links no network
// code at all: verification never fetches certificates or collateral. One
// check goes beyond go-tdx-guest's offline verification: a TDX quote must come
// from Intel's TD quoting enclave, whose identity (MRSIGNER, ISVPRODID, no
// DEBUG, QE vendor ID) is pinned here because only collateral would give it.
//
// pkg/attestedlog checks the evidence in an audit log's genesis records.
package evidence
