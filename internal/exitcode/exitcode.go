// Package exitcode holds cmcp's documented exit codes and the error type that
// carries one (with hints for the reader) through the domain packages to
// cli.Main. It renders nothing: internal/ui turns an error into text.
package exitcode

import (
	"errors"
	"fmt"
)

// Exit codes. They are part of cmcp's interface: scripts and CI gates rely on
// them, and the man pages document them. Never renumber one.
const (
	ExitOK       = 0  // success
	ExitFailure  = 1  // an unexpected internal failure
	ExitUsage    = 2  // bad flags, arguments or command line
	ExitIO       = 3  // a file or device could not be read or written
	ExitConfig   = 4  // the configuration is invalid
	ExitMismatch = 5  // a digest or pin did not match (spawn-digest --check)
	ExitRuntime  = 6  // the gateway failed while running
	ExitLogInteg = 10 // audit log integrity failure (hash, link, sequence, tree, canonical form)
	ExitLogSig   = 11 // a checkpoint signature does not verify, or records no signature covers (--require-signed, a --segment file without a checkpoint)
	ExitLogKey   = 12 // the log is signed by a key that is not trusted, or its genesis evidence is rejected
	ExitLogTrunc = 13 // truncation or rollback against a saved checkpoint
	ExitLogFork  = 14 // a fork: the log is inconsistent with a saved checkpoint
	ExitEvidence = 20 // attestation evidence is malformed or its signatures do not verify
	ExitRefValue = 21 // evidence verified but a reference value or policy did not match
	ExitBinding  = 22 // evidence does not bind the expected key, nonce or statement
	ExitReplay   = 30 // replay found a decision that differs from the recorded one, a tampered payload, or an inconsistent call record
)

// ExitCodes lists every exit code with its meaning, for the man pages.
var ExitCodes = []struct {
	Code    int
	Meaning string
}{
	{ExitOK, "success"},
	{ExitFailure, "unexpected internal failure"},
	{ExitUsage, "usage error: bad flags or arguments"},
	{ExitIO, "a file or device could not be read or written"},
	{ExitConfig, "the configuration is invalid"},
	{ExitMismatch, "a digest or pin did not match"},
	{ExitRuntime, "the gateway failed while running"},
	{ExitLogInteg, "audit log integrity failure"},
	{ExitLogSig, "a checkpoint signature does not verify, or records no signature covers (--require-signed; a verify-chain --segment file without a checkpoint)"},
	{ExitLogKey, "the log is signed by an untrusted key, or its genesis evidence is rejected"},
	{ExitLogTrunc, "truncation or rollback detected against a saved checkpoint"},
	{ExitLogFork, "fork detected: the log is inconsistent with a saved checkpoint"},
	{ExitEvidence, "attestation evidence is malformed or does not verify"},
	{ExitRefValue, "evidence does not match the reference values or policy"},
	{ExitBinding, "evidence does not bind the expected key, nonce or statement"},
	{ExitReplay, "replay found a decision that differs from the recorded one, a tampered payload, or an inconsistent call record"},
}

// Error is an error that carries an exit code and hints for the person who
// reads it. cli.Main prints it once as "cmcp: error: ..." followed by one
// "cmcp: hint: ..." line per hint.
type Error struct {
	Code  int
	Err   error
	Hints []string
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with the given exit code; %w wraps as in fmt.Errorf.
func Errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// WithCode wraps err with an exit code. A nil err stays nil.
func WithCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Code: code, Err: err}
}

// Hint returns e with one more hint line.
func (e *Error) Hint(format string, args ...any) *Error {
	e.Hints = append(e.Hints, fmt.Sprintf(format, args...))
	return e
}

// Coder is implemented by library errors that know their exit code.
type Coder interface{ ExitCode() int }

// Hinter is implemented by library errors that know what the user can do.
type Hinter interface{ Hints() []string }

// CodeOf returns the exit code for err: the code of the outermost *Error or
// Coder in its chain, else ExitFailure.
func CodeOf(err error) int {
	if err == nil {
		return ExitOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var c Coder
	if errors.As(err, &c) {
		return c.ExitCode()
	}
	return ExitFailure
}

// HintsOf collects the hints of every *Error and Hinter in err's chain.
func HintsOf(err error) []string {
	var out []string
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch v := e.(type) {
		case *Error:
			out = append(out, v.Hints...)
		case Hinter:
			out = append(out, v.Hints()...)
		}
	}
	return out
}

// LogFailureCode maps the class of an audit-log verification failure
// (pkg/auditlog/record.Class: "integrity", "signature", ...) to its exit code, so
// verify-chain and replay report the same failure with the same code.
func LogFailureCode(class string) int {
	switch class {
	case "integrity":
		return ExitLogInteg
	case "signature", "unsigned":
		return ExitLogSig
	case "key":
		return ExitLogKey
	case "truncation":
		return ExitLogTrunc
	case "fork":
		return ExitLogFork
	case "io":
		return ExitIO
	case "usage", "not-a-log":
		return ExitUsage
	}
	return ExitFailure
}
