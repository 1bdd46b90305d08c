package server

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// What the tests share with the server assembly's (internal/gwtest),
// under the names the tests use.

const (
	childEnv       = gwtest.ChildEnv
	testAdminToken = gwtest.AdminToken
	testAgentToken = gwtest.AgentToken
	testPolicy     = gwtest.TestPolicy
)

type (
	rec          = gwtest.Rec
	lockedWriter = gwtest.LockedWriter
	logEntry     = gwtest.LogEntry
)

// callPaths: gwtest.CallPaths.
var callPaths = func() (out []struct{ name, meta string }) {
	for _, p := range gwtest.CallPaths {
		out = append(out, struct{ name, meta string }{p.Name, p.Meta})
	}
	return out
}()

func selfDigest(t testing.TB) (string, digest.Digest) { return gwtest.SelfDigest(t) }
func readRecords(t testing.TB, dir string) []rec      { return gwtest.ReadRecords(t, dir) }
func kinds(rs []rec, kind string) []rec               { return gwtest.Kinds(rs, kind) }
func eventually(t *testing.T, d time.Duration, f func() string) {
	t.Helper()
	gwtest.Eventually(t, d, f)
}
func wireCode(err error) int64               { return gwtest.WireCode(err) }
func firstText(r *mcp.CallToolResult) string { return gwtest.FirstText(r) }
func call(t *testing.T, cs *mcp.ClientSession, name string, args any) (*mcp.CallToolResult, error) {
	t.Helper()
	return gwtest.Call(t, cs, name, args)
}
func clip(s string, n int) string { return gwtest.Clip(s, n) }
func pidAlive(pid int) bool       { return gwtest.PidAlive(pid) }
func pidOf(t *testing.T, cs *mcp.ClientSession, tool string) int {
	t.Helper()
	return gwtest.PidOf(t, cs, tool)
}
func policyBundle(t *testing.T, policies string) string {
	t.Helper()
	return gwtest.PolicyBundle(t, policies)
}
func readGenesis(t *testing.T, dir string, id age.Identity) (*record.Genesis, *auditlog.Opener) {
	t.Helper()
	return gwtest.ReadGenesis(t, dir, id)
}
func logEntries(t *testing.T, dir string) []logEntry {
	t.Helper()
	return gwtest.LogEntries(t, dir)
}
func adminRecords(t *testing.T, dir string) []*record.Admin {
	t.Helper()
	return gwtest.AdminRecords(t, dir)
}
func readAuditRecords(t *testing.T, dir string) []record.Record {
	t.Helper()
	return gwtest.ReadAuditRecords(t, dir)
}
func connectWith(endpoint, token string) (*mcp.ClientSession, error) {
	return gwtest.ConnectWith(endpoint, token)
}
func httpDo(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	return gwtest.HTTPDo(t, method, url, token)
}
func postCall(url, sid, token, body string) (int, string, error) {
	return gwtest.PostCall(url, sid, token, body)
}
func answerCode(answer string) int64 { return gwtest.AnswerCode(answer) }
func waitForwarded(t *testing.T, dir, tool string, n int) {
	t.Helper()
	gwtest.WaitForwarded(t, dir, tool, n)
}
func checkCutResult(t *testing.T, dir string, n int, code int64, why string) {
	t.Helper()
	gwtest.CheckCutResult(t, dir, n, code, why)
}
func certs(t *testing.T) (ca *x509.CertPool, server, client tls.Certificate, caPEM []byte) {
	t.Helper()
	return gwtest.Certs(t)
}
func parseExposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	return gwtest.ParseExposition(t, text)
}
func rawPost(t *testing.T, url, sid string, body []byte) (int, string) {
	t.Helper()
	return gwtest.RawPost(t, url, sid, body)
}
