// Package record is the audit log's record format: the record kinds and
// their bodies (Genesis, Call, Result, ...), the canonical encoding of a
// body and of a line's envelope (FORMAT.md), and the verification errors
// (VerifyError with its Class and Position, TamperError). A third party
// reading a cmcp audit log imports it to decode records; pkg/auditlog writes
// and verifies logs in this format.
package record
