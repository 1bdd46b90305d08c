// Command noprelay is the benchmark's floor: a process that relays
// newline-delimited JSON-RPC between its stdin/stdout and a child's,
// byte for byte, doing nothing else. "stdio no-op relay" in
// BenchmarkGateway puts it where cmcp would be, so the cost of one extra
// process hop on the machine at hand is measured next to cmcp's.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: noprelay COMMAND [ARG...]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		relay(os.Stdin, in)
		in.Close()
	}()
	relay(out, os.Stdout)
	_ = cmd.Wait()
}

// relay copies whole lines from r to w, one write per line.
func relay(r io.Reader, w io.Writer) {
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if len(line) > 0 && err == nil {
			if _, werr := w.Write(line); werr != nil {
				return
			}
		}
		line = line[:0]
		if err != nil {
			return
		}
	}
}
