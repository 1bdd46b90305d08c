// Package excerpt makes and checks the parts of an audit log that verify
// without the rest of it: an offline inclusion proof of one record
// (Prove, VerifyProof), the receipt of one session (MakeReceipt,
// VerifyReceipt: FORMAT.md section 12) and one segment file on its own
// (VerifySegment). Each is what an auditor is handed instead of the
// whole log, so the package is named for what its reader gets: an
// excerpt, checked against the epoch's signed checkpoints (and, for a
// receipt, the witnesses' cosignatures). It sits above package auditlog,
// whose verifier it runs on the epoch an excerpt is cut from.
package excerpt
