package config

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"unicode/utf8"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Policy is the `policy:` section: the Cedar bundle that decides every call.
//
//	policy:
//	  dir: policy/            # a directory of .cedar files and one .cedarschema (relative to the configuration file)
//	  expect: sha256:...      # the bundle's tree digest; the gateway refuses another bundle
//	  mode: enforcing         # enforcing (default), advisory or silent
//	  groups:                 # Group::"ops" is a parent of Agent::"carol" and Agent::"dave"
//	    ops: [carol, dave]
type Policy struct {
	Dir    string              `yaml:"dir" json:"dir"`
	Expect digest.Digest       `yaml:"expect" json:"expect"`
	Mode   string              `yaml:"mode" json:"mode"`
	Groups map[string][]string `yaml:"groups" json:"groups"`
}

// cedarID is a group name's characters; its bound of 256 characters is
// checked apart (validCedarID): the counted repetition compiled to
// ~300 KB kept in the heap from package initialisation on.
var cedarID = regexp.MustCompile(`^[^"\\\x00-\x1f]+$`)

// validCedarID reports whether s is 1 to 256 characters (runes, as the
// regular expression counts them) without quotes, backslashes or control
// characters.
func validCedarID(s string) bool {
	return utf8.RuneCountInString(s) <= 256 && cedarID.MatchString(s)
}

// Validate checks the section without reading the bundle.
func (p *Policy) Validate() error {
	if p.Dir == "" {
		return fmt.Errorf("policy.dir is required: a directory of .cedar files and one .cedarschema")
	}
	switch p.Mode {
	case "", "enforcing", "advisory", "silent":
	default:
		return valueAt("mode").errorf("policy.mode %q: want enforcing, advisory or silent", p.Mode)
	}
	for _, g := range slices.Sorted(maps.Keys(p.Groups)) {
		if !validCedarID(g) {
			return valueAt("groups", keyOf(g)).errorf("policy.groups: group name %q: want 1 to 256 characters without quotes, backslashes or control characters", g)
		}
		seen := map[string]bool{}
		for i, m := range p.Groups[g] {
			if m == "" {
				return valueAt("groups", g, i).errorf("policy.groups.%s: empty agent identity", g)
			}
			if seen[m] {
				return valueAt("groups", g, i).errorf("policy.groups.%s: agent %q listed twice", g, m)
			}
			seen[m] = true
		}
	}
	return nil
}
