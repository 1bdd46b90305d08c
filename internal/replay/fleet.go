package replay

import (
	"cmp"
	"slices"
	"strings"
)

// Merge makes one timeline of the reports of several gateways' logs (a
// fleet): every session and call names its gateway (its log directory),
// sessions are ordered by start and calls by time, the summaries add up,
// and each warning names its log.
func Merge(reps []*Report) *Report {
	out := &Report{Log: "", Sessions: []*Session{}, Calls: []*Call{}}
	var logs, unverified []string
	for _, r := range reps {
		logs = append(logs, r.Log)
		if r.Unverified != "" {
			unverified = append(unverified, r.Log+": "+r.Unverified)
		}
		for d, b := range r.Bundles {
			if out.Bundles == nil {
				out.Bundles = map[string]string{}
			}
			out.Bundles[d] = b
		}
		if r.WhatIf != "" {
			out.WhatIf = r.WhatIf
		}
		for _, s := range r.Sessions {
			s.Gateway = r.Log
			out.Sessions = append(out.Sessions, s)
		}
		for _, c := range r.Calls {
			c.Gateway = r.Log
			out.Calls = append(out.Calls, c)
		}
		for _, w := range r.Warnings {
			out.Warnings = append(out.Warnings, r.Log+": "+w)
		}
		a, b := &out.Summary, r.Summary
		a.Records += b.Records
		a.Calls += b.Calls
		a.Accesses += b.Accesses
		a.Same += b.Same
		a.Differs += b.Differs
		a.NotReplayable += b.NotReplayable
		a.Tampered += b.Tampered
		a.NoBundle += b.NoBundle
		a.NoDecision += b.NoDecision
		a.Incomplete += b.Incomplete
		a.Inconsistent += b.Inconsistent
		a.NoResult += b.NoResult
		a.Unsigned += b.Unsigned
		a.Changes += b.Changes
		a.WhatIfNotEvaluated += b.WhatIfNotEvaluated
	}
	out.Log = strings.Join(logs, " ")
	out.Unverified = strings.Join(unverified, "; ")
	slices.SortStableFunc(out.Sessions, func(a, b *Session) int { return a.Start.Compare(b.Start) })
	slices.SortStableFunc(out.Calls, func(a, b *Call) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.Gateway, b.Gateway))
	})
	return out
}
