package config

import (
	"strings"
	"testing"
)

func TestPolicySection(t *testing.T) {
	cases := []struct {
		name string
		p    Policy
		want string
	}{
		{"ok", Policy{Dir: "p", Mode: "advisory", Groups: map[string][]string{"ops": {"a", "b"}}}, ""},
		{"default mode", Policy{Dir: "p"}, ""},
		{"no dir", Policy{}, "policy.dir is required"},
		{"bad mode", Policy{Dir: "p", Mode: "permissive"}, `policy.mode "permissive"`},
		{"quote in group", Policy{Dir: "p", Groups: map[string][]string{`o"ps`: {"a"}}}, "group name"},
		{"empty member", Policy{Dir: "p", Groups: map[string][]string{"ops": {""}}}, "empty agent identity"},
		{"duplicate member", Policy{Dir: "p", Groups: map[string][]string{"ops": {"a", "a"}}}, `agent "a" listed twice`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
