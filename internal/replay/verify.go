package replay

import (
	"errors"
	"io/fs"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// NotVerifiedError is a log that does not verify; replay refuses it unless
// Options.Unverified. It wraps the *record.VerifyError.
type NotVerifiedError struct{ Err error }

func (e *NotVerifiedError) Error() string { return "the audit log does not verify: " + e.Err.Error() }
func (e *NotVerifiedError) Unwrap() error { return e.Err }

// ReadError is a log replay could not read to the end: a record that is
// not one a gateway writes (a member of another type: forged, and
// re-signed if the log verified), or a file it could not read.
type ReadError struct {
	Err        error
	Unverified bool // the log did not verify (Options.Unverified)
}

func (e *ReadError) Error() string {
	if e.Unverified {
		return "the unverified log cannot be read: " + e.Err.Error()
	}
	return "the log cannot be read: " + e.Err.Error()
}

func (e *ReadError) Unwrap() error { return e.Err }

// ExitCode is the error's own code if it has one, verify-chain's for a
// verification failure, exitcode.ExitIO for a file that could not be read, and
// exitcode.ExitLogInteg (a record not in the form the gateway writes) otherwise.
func (e *ReadError) ExitCode() int {
	var c exitcode.Coder
	var ve *record.VerifyError
	var pe *fs.PathError
	switch {
	case errors.As(e.Err, &c):
		return c.ExitCode()
	case errors.As(e.Err, &ve):
		return exitcode.LogFailureCode(string(ve.Class))
	case errors.As(e.Err, &pe):
		return exitcode.ExitIO
	}
	return exitcode.ExitLogInteg
}

// ExitCode is the verify-chain exit code of the failure's class.
func (e *NotVerifiedError) ExitCode() int {
	var ve *record.VerifyError
	if !errors.As(e.Err, &ve) {
		return exitcode.ExitIO
	}
	return exitcode.LogFailureCode(string(ve.Class))
}

// Hints says how to go on.
func (e *NotVerifiedError) Hints() []string {
	return []string{"replay refuses a log that does not verify; run cmcp verify-chain for the details, or pass --unverified to replay it anyway (every line is then marked UNVERIFIED)"}
}
