package upstream

// sealError is a failure to make the sealed copy: the spawn is refused,
// never run from the file instead.
type sealError struct {
	op  string
	err error
}

func (e *sealError) Error() string { return e.op + ": " + e.err.Error() }
func (e *sealError) Unwrap() error { return e.err }
