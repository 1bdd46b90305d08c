// Package auditlog reads, writes and verifies cmcp's audit log: JSON Lines
// in RFC 8785 canonical form, each record linked to the previous one by its
// leaf hash, an RFC 6962 Merkle tree over the records of an epoch, and
// in-band C2SP signed checkpoints (Ed25519). Payloads appear only as HMAC
// commitments; an optional vault keeps them sealed with age for auditors.
// The format is specified in FORMAT.md. This package does no network I/O.
// The C2SP formats it uses (checkpoints, note keys, cosignatures, proofs)
// are package c2sp; the record kinds, their encoding and the verification
// errors are package record; the directory layout is internal/logdir.
// What verifies without the whole log (offline proofs, session receipts,
// one segment on its own) is package excerpt, above this one.
package auditlog
