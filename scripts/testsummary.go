//go:build ignore

// Testsummary reads `go test -json` on stdin and prints what `go test`
// prints without -v (each package's ok/FAIL line, the output of the tests
// that failed, build errors), then one last line, "N passed, N failed",
// counting top-level tests and examples (a package that failed outside any
// test, as a build error or a crash in TestMain, counts as one failed). It
// exits 1 when anything failed. scripts/test.sh runs it:
//
//	go test -json ./... | go run scripts/testsummary.go
//
// With -started UNIXSECONDS (when test.sh began), the line before the last
// says how long go test took (from testsummary's own start, which is go
// test's) and the whole command.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Output     string
}

func main() {
	began := time.Now()
	started := flag.Int64("started", 0, "when the whole run began, in Unix seconds: print the elapsed times")
	flag.Parse()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	type key struct{ pkg, test string }
	held := map[key][]string{} // a running test's output, printed if it fails
	failedIn := map[string]int{}
	passed, failed := 0, 0
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not an event: go's own message
			out.Flush()
			continue
		}
		topLevel := e.Test != "" && !strings.Contains(e.Test, "/")
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
		case "output":
			if e.Test == "" {
				if !strings.HasPrefix(e.Output, "=== ") && e.Output != "PASS\n" {
					fmt.Fprint(out, e.Output)
					out.Flush()
				}
				continue
			}
			if !strings.HasPrefix(e.Output, "=== ") {
				k := key{e.Package, e.Test}
				held[k] = append(held[k], e.Output)
			}
		case "pass", "skip":
			if e.Test == "" {
				continue
			}
			if topLevel && e.Action == "pass" {
				passed++
			}
			delete(held, key{e.Package, e.Test})
		case "fail":
			if e.Test == "" {
				if failedIn[e.Package] == 0 {
					failed++ // failed outside any test
				}
				continue
			}
			if topLevel {
				failed++
				failedIn[e.Package]++
			}
			k := key{e.Package, e.Test}
			for _, line := range held[k] {
				fmt.Fprint(out, line)
			}
			delete(held, k)
			out.Flush()
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(out, "testsummary:", err)
		failed++
	}
	if *started > 0 {
		fmt.Fprintf(out, "-- go test: %d s (all steps: %d s)\n", int(time.Since(began).Seconds()), time.Now().Unix()-*started)
	}
	fmt.Fprintf(out, "%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		out.Flush()
		os.Exit(1)
	}
}
