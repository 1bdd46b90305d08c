// Command noproxy is the benchmark's floor for HTTP: a reverse proxy that
// passes every request to one MCP endpoint and streams the answer back,
// doing nothing else. "http no-op proxy" in BenchmarkGateway puts it where
// cmcp would be, so the cost of one extra HTTP hop is measured next to
// cmcp's.
package main

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: noproxy LISTEN-ADDR TARGET-URL")
		os.Exit(2)
	}
	target, err := url.Parse(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p := httputil.NewSingleHostReverseProxy(target)
	p.FlushInterval = -1 // stream SSE answers as they come
	p.Transport = &http.Transport{MaxIdleConnsPerHost: 64}
	if err := http.ListenAndServe(os.Args[1], p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
