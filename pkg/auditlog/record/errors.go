package record

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
)

// Class classifies a verification failure. The CLI maps each class to its
// own exit code.
type Class string

const (
	ClassIntegrity  Class = "integrity"  // hash, link, sequence, tree, canonical form, structure
	ClassSignature  Class = "signature"  // a checkpoint signature does not verify
	ClassUnsigned   Class = "unsigned"   // records no signature of their epoch covers (VerifyOptions.RequireSigned)
	ClassKey        Class = "key"        // signed by a key that is not trusted; evidence rejected
	ClassTruncation Class = "truncation" // records or epochs missing against a checkpoint or a successor
	ClassFork       Class = "fork"       // inconsistent with a saved checkpoint
	ClassIO         Class = "io"         // a file could not be read
	ClassNotLog     Class = "not-a-log"  // the directory is not an audit log
)

// VerifyError is a verification failure with its precise location.
type VerifyError struct {
	Class    Class    `json:"class"`
	Pos      Position `json:"position"`
	Msg      string   `json:"message"`
	Expected string   `json:"expected,omitempty"` // what the log (or a checkpoint) says
	Computed string   `json:"computed,omitempty"` // what the verifier computed
	LastGood int64    `json:"last_good_checkpoint,omitempty"`
	Hint     string   `json:"hint,omitempty"`
	Err      error    `json:"-"`
}

func (e *VerifyError) Error() string {
	var b strings.Builder
	switch e.Class {
	case ClassUsage, ClassNotLog, ClassIO:
	default:
		b.WriteString(string(e.Class))
		b.WriteString(" failure")
		if e.Pos.Epoch == 0 && e.Pos.File == "" {
			b.WriteString(": ")
		} else {
			b.WriteString(" at ")
		}
	}
	if e.Pos.Epoch != 0 || e.Pos.File != "" {
		b.WriteString(e.Pos.String())
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// IsVerification reports whether e is a finding about the log (as opposed
// to bad input or an unreadable file).
func (e *VerifyError) IsVerification() bool {
	switch e.Class {
	case ClassUsage, ClassNotLog, ClassIO:
		return false
	}
	return true
}

func (e *VerifyError) Unwrap() error { return e.Err }

// Hints implements the CLI's hint interface.
func (e *VerifyError) Hints() []string {
	var hs []string
	if e.Hint != "" {
		hs = append(hs, e.Hint)
	}
	return hs
}

func IOFailure(pos Position, err error) *VerifyError {
	ve := &VerifyError{Class: ClassIO, Pos: pos, Msg: err.Error(), Err: err}
	if errors.Is(err, fs.ErrPermission) {
		ve.Hint = "run as a user that may read the audit directory"
	}
	return ve
}

// TamperError is returned by Open when the previous epoch is damaged before
// its last signed checkpoint: that is tampering or disk corruption, not a
// crash, and the writer refuses to continue.
type TamperError struct {
	Dir string
	Err *VerifyError
}

func (e *TamperError) Error() string {
	return fmt.Sprintf("audit directory %s is damaged before its last signed checkpoint, which a crash cannot cause (tampering or disk corruption): %v", e.Dir, e.Err)
}

func (e *TamperError) Unwrap() error { return e.Err }

func (e *TamperError) Hints() []string {
	return []string{
		"keep the directory unchanged as evidence and run 'cmcp verify-chain " + e.Dir + "' for the full report",
		"to keep serving, start a new audit directory (move this one aside); the gateway never appends to a damaged log",
	}
}

// Position locates a record or a failure in an audit directory.
type Position struct {
	Epoch  int    `json:"epoch"`
	File   string `json:"file,omitempty"`   // path of the segment file
	Line   int64  `json:"line,omitempty"`   // 1-based line in the file
	Offset int64  `json:"offset"`           // byte offset in the file
	Index  int64  `json:"index"`            // record index (seq) in the epoch
	Kind   Kind   `json:"kind,omitempty"`   // kind of the record, if known
	Record string `json:"record,omitempty"` // excerpt of the line
}

func (p Position) String() string {
	if p.File == "" {
		return fmt.Sprintf("epoch %d", p.Epoch)
	}
	if p.Line == 0 {
		return fmt.Sprintf("epoch %d, %s", p.Epoch, p.File)
	}
	return fmt.Sprintf("epoch %d, record %d (%s:%d, byte %d)", p.Epoch, p.Index, p.File, p.Line, p.Offset)
}

// ClassUsage marks bad verifier input (a malformed --key, an unreadable
// --checkpoint).
const ClassUsage Class = "usage"
