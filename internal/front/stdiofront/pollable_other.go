//go:build !linux

package stdiofront

import "io"

func pollableReader(in io.ReadCloser) io.ReadCloser    { return in }
func pollableWriter(out io.WriteCloser) io.WriteCloser { return out }
