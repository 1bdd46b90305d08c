package replay

import "fmt"

// SummaryLine is the line that sums a replay up: replayed says it was
// replayed against bundles (Options.Policies), whatIf that a what-if
// bundle was given.
func (rep *Report) SummaryLine(replayed, whatIf bool) string {
	s := rep.Summary
	line := fmt.Sprintf("%d records, %d calls", s.Records, s.Calls)
	if s.Accesses > 0 {
		line += fmt.Sprintf(", %d resource or prompt accesses", s.Accesses)
	}
	if replayed {
		line += fmt.Sprintf("; replay: %d same, %d differ, %d not replayable, %d tampered, %d without a decision", s.Same, s.Differs, s.NotReplayable, s.Tampered, s.NoDecision)
		if s.NoBundle > 0 {
			line += fmt.Sprintf(", %d decided by a bundle not given", s.NoBundle)
		}
		if s.Incomplete > 0 {
			line += fmt.Sprintf(", %d incomplete", s.Incomplete)
		}
	}
	if s.Inconsistent > 0 {
		line += fmt.Sprintf("; %d inconsistent call record(s)", s.Inconsistent)
	}
	if s.NoResult > 0 {
		line += fmt.Sprintf("; %d forwarded without a result record", s.NoResult)
	}
	if s.Unsigned > 0 {
		line += fmt.Sprintf("; %d in UNSIGNED records (no proof)", s.Unsigned)
	}
	if whatIf {
		line += fmt.Sprintf("; what-if %s: %d would change", rep.WhatIf, s.Changes)
		if s.WhatIfNotEvaluated > 0 {
			line += fmt.Sprintf(", %d could not be evaluated", s.WhatIfNotEvaluated)
		}
	}
	if rep.Unverified != "" {
		line = "UNVERIFIED " + line
	}
	return line
}

// Finding reports whether c is a finding: its record contradicts itself
// or its epoch's policy, or its replay or what-if has an outcome other
// than the same or unchanged decision (or none to compare).
func (c *Call) Finding() bool {
	if c.Inconsistent != "" {
		return true
	}
	for _, ck := range []*Check{c.Replay, c.WhatIf} {
		// A call that could not be checked (Why) is no finding: it is
		// counted with the others of its cause (NotChecked).
		if ck != nil && ck.Status != StatusSame && ck.Status != StatusUnchanged && ck.Status != StatusNoDecision && ck.Why == "" {
			return true
		}
	}
	return false
}

// NotCheckedGroup is the calls that could not be checked for one cause.
type NotCheckedGroup struct {
	Label, Why string
	N          int
	First      []string // the first records, epoch:index
}

// NotChecked groups the calls whose replay or what-if could not be checked
// (not replayable, decided by a bundle not given) by cause, in the order
// first met.
func NotChecked(calls []*Call) []*NotCheckedGroup {
	var groups []*NotCheckedGroup
	byKey := map[[2]string]*NotCheckedGroup{}
	for _, c := range calls {
		for _, x := range []struct {
			ck       *Check
			whatIfOf bool
		}{{c.Replay, false}, {c.WhatIf, true}} {
			if x.ck == nil || x.ck.Why == "" {
				continue
			}
			label := "not replayable"
			switch {
			case x.whatIfOf:
				label = "what-if not evaluated"
			case x.ck.Status == StatusNoBundle:
				label = "not replayed"
			}
			k := [2]string{label, x.ck.Why}
			g := byKey[k]
			if g == nil {
				g = &NotCheckedGroup{Label: label, Why: x.ck.Why}
				byKey[k] = g
				groups = append(groups, g)
			}
			if g.N++; len(g.First) < 3 {
				g.First = append(g.First, fmt.Sprintf("%d:%d", c.Epoch, c.Index))
			}
		}
	}
	return groups
}
