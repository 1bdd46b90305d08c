package replay

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// benchLog writes a log of n calls (n/2 fs calls that depend on their path
// argument, n/2 git calls that do not) with a result for each forwarded
// call, as the gateway does, with 8 concurrent sessions.
func benchLog(b *testing.B, n int, id *age.X25519Identity) string {
	bu, err := policy.Load(context.Background(), "testdata/recorded", policy.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := b.TempDir()
	opts := auditlog.Options{Key: key, PolicyDigest: bu.Digest(), PolicyMode: "enforcing", Durability: record.DurabilityInterval, SyncInterval: time.Second}
	if id != nil {
		opts.Recipients, opts.Vault = []string{id.Recipient().String()}, true
	}
	w, err := auditlog.Open(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	eng := policy.NewEngine(bu, policy.Enforcing, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	const conc = 8
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess := fmt.Sprintf("s%d", g)
			for i := range n / conc {
				c := policy.Call{Agent: "alice", Session: sess, Tool: "git__log", ToolName: "log", Upstream: "git", EvidenceClass: "spawn-measured", Annotations: policy.DefaultAnnotations}
				args := []byte(`{}`)
				if i%2 == 0 {
					c.Tool, c.ToolName, c.Upstream = "fs__read_file", "read_file", "fs"
					args = fmt.Appendf(nil, `{"path":"/srv/data/%d/report.csv"}`, i)
					if i%10 == 0 {
						args = []byte(`{"path":"/etc/shadow"}`)
					}
				}
				c.Arguments = args
				o := eng.DecideCall(c)
				rec := &record.Call{Session: sess, Agent: c.Agent, Tool: c.Tool, Upstream: c.Upstream, UpstreamTool: c.ToolName,
					EvidenceClass: c.EvidenceClass, Args: w.Commit(args), Decision: o.Effect(), PolicyIDs: o.PolicyIDs,
					PolicyMode: string(o.Mode), PolicyBundle: o.Bundle, Outcome: record.OutcomeForwarded, PolicyInput: o.Input()}
				if o.Refuse {
					rec.Outcome = record.OutcomeRefused
				}
				rc, err := w.Append(ctx, rec)
				if err != nil {
					b.Error(err)
					return
				}
				if !o.Refuse {
					if _, err := w.Append(ctx, &record.Result{Call: rc.Index, Session: sess, Outcome: record.ResultOK, LatencyMicros: 900}); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return dir
}

func benchReplay(b *testing.B, withIdentity bool) {
	n := 100000
	if testing.Short() {
		n = 10000
	}
	var id *age.X25519Identity
	if withIdentity {
		id, _ = age.GenerateX25519Identity()
	}
	dir := benchLog(b, n, id)
	opts := Options{Policies: []string{"testdata/recorded"}}
	if withIdentity {
		opts.Identities = []age.Identity{id}
	}
	// As the replay command does.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		rep, err := Run(context.Background(), dir, opts)
		if err != nil {
			b.Fatal(err)
		}
		if rep.Summary.Calls != n || rep.Findings() {
			b.Fatalf("%+v", rep.Summary)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	// The machine is shared: CPU time says what replay costs regardless of
	// how much of the machine it got.
	b.ReportMetric(float64(n)*float64(b.N)/(cpuTime()-cpu0).Seconds(), "calls/cpu-s")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReplay100k replays a 100,000-call log (verification included)
// against its bundle without the vault: the fs calls are not replayable.
func BenchmarkReplay100k(b *testing.B) { benchReplay(b, false) }

// BenchmarkReplay100kVault opens the vault: every payload is decrypted
// (one age X25519 file per payload) and checked against its commitment.
func BenchmarkReplay100kVault(b *testing.B) { benchReplay(b, true) }
