// Command hoprtt measures what one extra HTTP hop costs on this machine
// when nothing else runs: sequential POSTs from a Go net/http client to a
// trivial net/http server that answers a fixed 80-byte JSON-RPC result,
// directly and through httputil.ReverseProxy in a third process. It is the
// bare form of BenchmarkGateway's "http no-op proxy" floor, without the
// go-sdk on either end, and tells how much of a latency budget (1.3 × an
// HTTP direct call at c=1) a single loopback hop uses before the gateway
// does any work.
//
//	go run ./internal/bench/hoprtt [-calls 3000] [-rounds 3]
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

const (
	request = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`
	answer  = `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}`
)

func main() {
	if len(os.Args) >= 2 && os.Args[1] == "-serve" {
		serve(os.Args[2:])
		return
	}
	calls := flag.Int("calls", 3000, "timed POSTs per measurement (the first sixth more are warm-up)")
	rounds := flag.Int("rounds", 3, "rounds, each measuring direct then through the proxy")
	flag.Parse()
	server, stopServer, err := start("-serve", "server")
	if err != nil {
		fail(err)
	}
	defer stopServer()
	proxy, stopProxy, err := start("-serve", "proxy", server)
	if err != nil {
		fail(err)
	}
	defer stopProxy()
	client := &http.Client{}
	fmt.Printf("one HTTP hop on loopback, %d sequential POSTs per measurement, p50:\n", *calls)
	for r := range *rounds {
		direct, err := measure(client, server, *calls)
		if err != nil {
			fail(err)
		}
		via, err := measure(client, proxy, *calls)
		if err != nil {
			fail(err)
		}
		fmt.Printf("round %d: direct %v, through the proxy %v: the hop adds %v (%.2f × direct)\n",
			r+1, direct.Round(time.Microsecond), via.Round(time.Microsecond), (via - direct).Round(time.Microsecond), float64(via)/float64(direct))
	}
}

// serve runs the trivial server or the proxy in front of addr, printing
// the address it listens on as its first line.
func serve(args []string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	})
	if len(args) == 2 && args[0] == "proxy" {
		target, err := url.Parse("http://" + args[1])
		if err != nil {
			fail(err)
		}
		p := httputil.NewSingleHostReverseProxy(target)
		p.Transport = &http.Transport{MaxIdleConnsPerHost: 8}
		h = p
	}
	fmt.Println(ln.Addr())
	fail(http.Serve(ln, h))
}

// start runs this program again with args and returns the address it
// printed and a function that stops it.
func start(args ...string) (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("%v did not print its address: %v", args, err)
	}
	return strings.TrimSpace(line), stop, nil
}

// measure times calls sequential POSTs to addr after a warm-up and returns
// the median.
func measure(c *http.Client, addr string, calls int) (time.Duration, error) {
	warm := calls / 6
	ds := make([]time.Duration, 0, calls)
	for i := range warm + calls {
		t := time.Now()
		resp, err := c.Post("http://"+addr+"/", "application/json", bytes.NewReader([]byte(request)))
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, err
		}
		if i >= warm {
			ds = append(ds, time.Since(t))
		}
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "hoprtt:", err)
	os.Exit(1)
}
