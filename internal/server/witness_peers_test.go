//go:build peers

package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/internal/witness/litewitness"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/excerpt"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestServeWitnessedWithReceipts runs a real gateway (a measured stdio
// child, its own audit log) with a log identity, a real witness
// (litewitness) and session receipts: calls are never held up by the
// witness; /readyz is ready while it cosigns, names it (503) once it is
// down, and is ready again once it is back; /metrics counts it; the admin
// listener serves a session's receipt on request, and a session that ends
// gets its receipt written; both verify alone with the witness; after a
// restart (a new epoch, no operator step) the log still verifies with the
// witness and no saved checkpoint.
func TestServeWitnessedWithReceipts(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	lw := litewitness.Start(t, "w1.example/lw")
	key, err := c2sp.LoadOrCreateLogKey(filepath.Join(dir, "state", "log.key"), "example.com/gw1")
	if err != nil {
		t.Fatal(err)
	}
	_, vkey, _ := c2sp.NewNoteKeys("example.com/gw1", key)
	lw.AddLog("example.com/gw1", vkey)
	adminAddr := freePort(t)
	cfgPath := filepath.Join(dir, "cmcp.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server: {listen: %s, tee: software}
audit:
  dir: audit
  log: {origin: example.com/gw1, key_file: state/log.key}
  witnesses:
    - {url: '%s', key: '%s'}
  receipts: {dir: receipts}
admin: {listen: %s, token_sha256: %s}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, freePort(t), lw.URL, lw.Vkey, adminAddr, httpfront.TokenDigest(testAdminToken), exe, childEnv, pin)), 0o600)
	auditDir := filepath.Join(dir, "audit")
	readyz := "http://" + adminAddr + "/readyz"
	witnessOpt := excerpt.ReceiptOptions{Witnesses: []string{lw.Vkey}, WitnessQuorum: 1}

	for run := 1; run <= 2; run++ {
		cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
		eventually(t, 60*time.Second, func() string {
			if code, body := httpDo(t, "GET", readyz, testAdminToken); code != 200 {
				return fmt.Sprintf("readyz %d %s", code, body)
			}
			return ""
		})
		ended, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		live, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := call(t, ended, "t__echo", map[string]any{"text": fmt.Sprint("a", i)}); err != nil {
				t.Fatal(err)
			}
			if _, err := call(t, live, "t__echo", map[string]any{"text": fmt.Sprint("b", i)}); err != nil {
				t.Fatal(err)
			}
		}
		endedID := ended.ID()
		ended.Close()

		// On request: the live session's receipt, witnessed.
		code, body := httpDo(t, "GET", "http://"+adminAddr+"/admin/receipt?session="+live.ID(), testAdminToken)
		if code != 200 {
			t.Fatalf("receipt on request: %d %s", code, body)
		}
		res, err := excerpt.VerifyReceipt([]byte(body), witnessOpt)
		if err != nil {
			t.Fatalf("the receipt served on request: %v", err)
		}
		if res.Kinds[record.KindCall] != 3 || res.Log == nil {
			t.Fatalf("receipt on request: %+v", res)
		}
		if code, _ := httpDo(t, "GET", "http://"+adminAddr+"/admin/receipt?session=nobody", testAdminToken); code != 404 {
			t.Fatalf("receipt of an unknown session: %d", code)
		}
		if code, _ := httpDo(t, "GET", "http://"+adminAddr+"/admin/receipt?session="+live.ID(), ""); code != 401 {
			t.Fatalf("receipt without the admin token: %d", code)
		}
		// At session end: written to receipts/.
		var rfile string
		eventually(t, 60*time.Second, func() string {
			m, _ := filepath.Glob(filepath.Join(dir, "receipts", "*-"+endedID+".receipt.json"))
			if len(m) == 0 {
				return "no receipt file for the session that ended"
			}
			rfile = m[0]
			return ""
		})
		b, _ := os.ReadFile(rfile)
		if res, err := excerpt.VerifyReceipt(b, witnessOpt); err != nil || res.Kinds[record.KindSession] != 2 {
			t.Fatalf("the receipt written at session end: %v %+v", err, res)
		}

		if run == 1 {
			// The witness goes down: calls go on, /readyz names it.
			lw.Stop()
			start := time.Now()
			for i := range 5 {
				if _, err := call(t, live, "t__echo", map[string]any{"text": fmt.Sprint("c", i)}); err != nil {
					t.Fatalf("a call with the witness down: %v", err)
				}
			}
			t.Logf("5 calls with the witness down: %v", time.Since(start))
			httpDo(t, "POST", "http://"+adminAddr+"/admin/checkpoint", testAdminToken)
			eventually(t, 60*time.Second, func() string {
				code, body := httpDo(t, "GET", readyz, testAdminToken)
				if code != 503 || !strings.Contains(body, "witness w1.example/lw down") {
					return fmt.Sprintf("readyz %d %q", code, body)
				}
				return ""
			})
			_, metrics := httpDo(t, "GET", "http://"+adminAddr+"/metrics", testAdminToken)
			m := gwtest.ParseExposition(t, metrics)
			if m["cmcp_witnesses_configured"] != 1 || m["cmcp_witnesses_cosigning"] != 0 || m["cmcp_witness_errors_total"] < 1 {
				t.Fatalf("witness metrics with the witness down: %v\n%s", m, metrics)
			}
			lw.Restart()
			httpDo(t, "POST", "http://"+adminAddr+"/admin/checkpoint", testAdminToken)
			eventually(t, 60*time.Second, func() string {
				if code, body := httpDo(t, "GET", readyz, testAdminToken); code != 200 {
					return fmt.Sprintf("readyz %d %s", code, body)
				}
				return ""
			})
		}
		live.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("gateway exit: %v\n%s", err, stderr.String())
		}
	}
	rep, err := auditlog.Verify(auditDir, auditlog.VerifyOptions{Witnesses: []string{lw.Vkey}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Epochs) != 2 || rep.Log.Witnessed == nil || rep.Log.Witnessed.Size != rep.Records {
		t.Fatalf("after two runs: %d epochs, witnessed %+v of %d records", len(rep.Epochs), rep.Log.Witnessed, rep.Records)
	}
}
