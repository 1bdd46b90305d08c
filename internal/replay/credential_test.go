package replay

import (
	"context"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestReplayReadsCredentialMintedRecords: a log with the gateway's
// credential_minted records (issue 19) verifies and replays like any
// other; the records change no call's outcome.
func TestReplayReadsCredentialMintedRecords(t *testing.T) {
	_, id := newKeys(t)
	dir, _ := writeLogWith(t, id, logSpec{before: func(w *auditlog.Writer, i int) {
		if _, err := w.Append(context.Background(), &record.CredentialMinted{Upstream: "fs", Identity: "agent-a", Source: "exec",
			Reason: "first", Expires: "2030-01-01T00:00:00Z", Fingerprint: "hmac-sha256:0123456789abcdef01234567"}); err != nil {
			t.Fatal(err)
		}
	}})
	rep, err := Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Findings() || len(rep.Calls) == 0 {
		t.Errorf("replay of a log with credential_minted records: findings %v, %d calls", rep.Findings(), len(rep.Calls))
	}
	if _, err := auditlog.Verify(dir, auditlog.VerifyOptions{}); err != nil {
		t.Errorf("verify: %v", err)
	}
}
