package replay

import (
	"context"
	"strings"
	"testing"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestReplayCatchesAnotherDeterminingPolicy: a call record changed only in
// the policies it names as determining its decision (the decision kept) is
// a finding: the record says which rule let the call through, and replay
// checks that too. A replay that compared only the decision passed every
// test (found in review).
func TestReplayCatchesAnotherDeterminingPolicy(t *testing.T) {
	_, id := newKeys(t)
	for _, tc := range []struct {
		name string
		ids  []string
	}{
		{"another policy", []string{"fs-allowed"}},
		{"one policy more", []string{"alice-git", "fs-allowed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Call 2 (alice, git__log) is allowed by alice-git.
			dir, idx := writeLogWith(t, id, logSpec{mut: func(i int, rec *record.Call) bool {
				if i == 2 {
					if strings.Join(rec.PolicyIDs, ",") != "alice-git" || rec.Decision != record.DecisionAllow {
						t.Fatalf("call 2 was decided %s by %v", rec.Decision, rec.PolicyIDs)
					}
					rec.PolicyIDs = tc.ids
				}
				return rec.Outcome == record.OutcomeForwarded
			}})
			rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(statuses(rep, replayOf), " "); got != "same same differs same same same" || !rep.Findings() || rep.Summary.Differs != 1 {
				t.Fatalf("statuses %s, findings %v", got, rep.Findings())
			}
			c := rep.Calls[2]
			want := "recorded allow by [" + strings.Join(tc.ids, ", ") + "], replay gives allow by [alice-git]"
			if c.Index != idx[2] || c.Replay.Reason != want {
				t.Fatalf("call %d: reason %q, want %q", c.Index, c.Replay.Reason, want)
			}
		})
	}
}
