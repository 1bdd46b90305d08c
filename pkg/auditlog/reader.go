package auditlog

import (
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// The reader and the epoch scanner live in internal/scan; these names
// are auditlog's API for them.
type (
	// Entry is one record as read from the log.
	Entry = scan.Entry
	// Reader iterates over every record of an audit directory in order:
	// epochs ascending, segments ascending, lines in file order. It
	// checks each line's form (strict canonical JSON with the common
	// members) but not the chain; run Verify first when the log is not
	// trusted. An incomplete final line (a crash) ends the iteration
	// without error.
	Reader = scan.Reader
	// EpochResult is what verifying one epoch established.
	EpochResult = scan.EpochResult
)

// NewReader opens the audit directory dir.
func NewReader(dir string) (*Reader, error) { return scan.NewReader(dir) }

// StatementOf returns the statement digest of a genesis body: the digest of
// its canonical JSON with the "statement" and "evidence" members removed.
func StatementOf(body []byte) (digest.Digest, error) { return scan.StatementOf(body) }
