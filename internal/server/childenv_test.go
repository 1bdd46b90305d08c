package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestServeSpawnRecordsTheEnvironment: a pinned upstream whose environment
// may load code (allow_code_env, PYTHONPATH from the gateway's
// environment) runs as spawn-unmeasured: its spawn record and its calls say
// so, and the record's reason names the variable, so a policy that asks for
// spawn-measured does not take it for measured. Every spawn record names
// the child's variables and commits to their values: the auditor opens the
// commitment to exactly the child's /proc/<pid>/environ, and a secret
// value appears nowhere in the audit directory in clear.
func TestServeSpawnRecordsTheEnvironment(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	auditor, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	const secret = "s3cret-value-4711"
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
audit:
  dir: audit
  recipients: [%s]
  vault: true
upstreams:
  - name: t
    stdio:
      command: %s
      env_allow: [PATH, CHILD_API_KEY, PYTHONPATH]
      env: {%s: server}
    pin:
      command: %s
    allow_code_env: true
`, auditor.Recipient(), exe, childEnv, pin)
	environ := []string{"PATH=" + os.Getenv("PATH"), "CHILD_API_KEY=" + secret, "PYTHONPATH=/nonexistent/evil", "GATEWAY_ONLY=x"}
	endpoint, auditDir := serveYAML(t, dir, yaml, environ)
	cs, err := connectWith(endpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__pid", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	var pid int64
	fmt.Sscan(firstText(res), &pid)
	childEnviron, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}

	var spawn *record.Spawn
	var calls []*record.Call
	eventually(t, 10*time.Second, func() string {
		spawn, calls = nil, nil
		for _, r := range readAuditRecords(t, auditDir) {
			switch r := r.(type) {
			case *record.Spawn:
				if r.PID == pid && r.Outcome == "started" {
					spawn = r
				}
			case *record.Call:
				calls = append(calls, r)
			}
		}
		if spawn == nil || len(calls) == 0 {
			return "no spawn record of the child, or no call record"
		}
		return ""
	})
	if spawn.EvidenceClass != upstream.ClassSpawnUnmeasured || !strings.HasSuffix(spawn.Reason, "load code the pin does not cover: PYTHONPATH") {
		t.Errorf("spawn record: class %q, reason %q; want spawn-unmeasured naming PYTHONPATH", spawn.EvidenceClass, spawn.Reason)
	}
	for _, c := range calls {
		if c.EvidenceClass != upstream.ClassSpawnUnmeasured {
			t.Errorf("call record of %s: evidence class %q, want spawn-unmeasured", c.Tool, c.EvidenceClass)
		}
	}
	if want := []string{"PATH", "CHILD_API_KEY", "PYTHONPATH", childEnv}; !slices.Equal(spawn.EnvNames, want) {
		t.Errorf("env_names %q, want %q", spawn.EnvNames, want)
	}
	if spawn.Env.IsZero() {
		t.Fatal("the spawn record has no commitment to the environment")
	}
	_, o := readGenesis(t, auditDir, auditor)
	payload, err := o.Payload(spawn.Env)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(payload, childEnviron) {
		t.Errorf("the env commitment opens to\n  %q\nbut the child's /proc/%d/environ is\n  %q", payload, pid, childEnviron)
	}
	err = filepath.WalkDir(auditDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s holds the child's secret value in clear", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
