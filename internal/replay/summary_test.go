package replay

import (
	"context"
	"testing"
)

// TestWhatIfCountsApart: what-if results are counted apart from replay's.
// Without the vault, the calls whose what-if decision needs the arguments
// could not be evaluated; before, they were counted as replay's "not
// replayable" though --policy was not given.
func TestWhatIfCountsApart(t *testing.T) {
	key, _ := newKeys(t)
	f := writeLog(t, key, nil, -1)
	rep, err := Run(context.Background(), f.dir, Options{WhatIf: "testdata/next"})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Summary
	n := 0
	for _, c := range rep.Calls {
		if c.WhatIf.Status != StatusUnchanged && c.WhatIf.Status != StatusChanges {
			n++
		}
	}
	if n == 0 || s.NotReplayable != 0 || s.Same != 0 || s.WhatIfNotEvaluated != n {
		t.Fatalf("%d what-ifs not evaluated; summary %+v", n, s)
	}
}
