package policy

import "testing"

// TestReadsToolsUsed: a bundle reads context.session.tools_used when some
// policy names it or uses the session (or the context) as a whole; one
// that reads only context.session.calls or .id, or tests has, does not.
// Replay's what-if simulates sessions only for the former: the what-if
// outcomes of earlier calls change tools_used, never calls or id.
func TestReadsToolsUsed(t *testing.T) {
	for _, tc := range []struct {
		name, policy string
		session      bool
		toolsUsed    bool
	}{
		{"none", `permit (principal, action, resource);`, false, false},
		{"calls", `forbid (principal, action, resource) when { context.session.calls >= 2 };`, true, false},
		{"id and has", `forbid (principal, action, resource) when { context has session && context.session has tools_used && context.session.id == "x" };`, true, false},
		{"tools_used", `forbid (principal, action, resource) when { context.session.calls > 1 && context.session.tools_used.contains("a") };`, true, true},
		{"session whole", `forbid (principal, action, resource) when { context.session == context.session };`, true, true},
		{"context whole", `forbid (principal, action, resource) when { context == context };`, true, true},
		{"tools_used isEmpty", `forbid (principal, action, resource) when { context.session.tools_used.isEmpty() };`, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := accessBundle(t, tc.policy)
			if b.ReadsSession() != tc.session || b.ReadsToolsUsed() != tc.toolsUsed {
				t.Fatalf("reads session %v tools_used %v, want %v %v", b.ReadsSession(), b.ReadsToolsUsed(), tc.session, tc.toolsUsed)
			}
		})
	}
}
