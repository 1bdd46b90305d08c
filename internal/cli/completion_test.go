package cli

import (
	"strings"
	"testing"
)

// TestCompletionOfAnEmptyWord: shells ask for completions with the word
// being completed as the last argument, empty at the start of a word
// (`cmcp <TAB>`). The check that refuses empty arguments once refused those
// requests too, so completion offered nothing.
func TestCompletionOfAnEmptyWord(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"__complete", ""}, []string{"serve", "verify-chain", "replay"}},
		{[]string{"__complete", "serve", "--log-level", ""}, []string{"debug", "warn"}},
		{[]string{"__complete", "verify-chain", "-o", ""}, []string{"text", "json"}},
		{[]string{"__completeNoDesc", "serve", "-c", ""}, []string{"yaml"}},
	} {
		code, out, errOut := runCLI(t, tt.args...)
		if code != 0 {
			t.Fatalf("%q: exit %d\n%s%s", tt.args, code, out, errOut)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("%q: %q not offered:\n%s", tt.args, w, out)
			}
		}
	}
	// An empty argument to a real command is still refused.
	if code, _, errOut := runCLI(t, "verify-chain", ""); code != 2 || !strings.Contains(errOut, "argument 1 of cmcp verify-chain is empty") {
		t.Fatalf("verify-chain '': exit %d %s", code, errOut)
	}
}
