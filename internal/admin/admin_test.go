package admin

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzAdminRequest feeds arbitrary bodies to the admin POST parser: it
// either accepts a {"reason": ...} object (or nothing) or answers 4xx with
// a JSON error, never anything else.
func FuzzAdminRequest(f *testing.F) {
	for _, s := range []string{"", `{"reason":"incident 42"}`, `{"reason": 1}`, `{"why":"x"}`, `{"reason":"a"} {"reason":"b"}`, "null", "[", strings.Repeat("x", 70<<10)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/admin/checkpoint", strings.NewReader(body))
		got, ok := readAdminRequest(rec, req)
		if ok {
			if rec.Code != 200 {
				t.Fatalf("accepted but wrote status %d", rec.Code)
			}
			if strings.TrimSpace(body) == "" && got.Reason != "" {
				t.Fatalf("empty body gave reason %q", got.Reason)
			}
			return
		}
		if rec.Code != 400 && rec.Code != 413 {
			t.Fatalf("refused with status %d", rec.Code)
		}
		var e map[string]string
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e["error"] == "" {
			t.Fatalf("refusal body %q is not a JSON error", rec.Body.String())
		}
	})
}
