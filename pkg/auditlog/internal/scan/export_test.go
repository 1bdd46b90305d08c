package scan

// The scanner's tests are in package scan_test: they write logs with
// auditlog's writer, which imports scan. These are what they look into.
var (
	LastCheckpointLine = lastCheckpointLine
	LastCheckpointIn   = lastCheckpointIn
)

const (
	ScanChunk    = scanChunk
	ReaderBuffer = readerBuffer
)
