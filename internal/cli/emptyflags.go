package cli

import (
	"slices"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/ui"
)

// rejectEmptyFlags refuses a string flag given with an empty value
// (`--nonce ""`, `--key=`, `--cert ""`). No flag of cmcp means anything when
// empty, and treating it as absent fails open: a verifier script that runs
// `cmcp attest verify ev.json --nonce "$NONCE"` with NONCE unset would skip
// the freshness check and exit 0, `spawn-digest --target "$PKG"` would pin
// no target, `replay --session "$S"` would replay every session.
func rejectEmptyFlags(cmd *cobra.Command) error {
	var bad *pflag.Flag
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if bad != nil {
			return
		}
		switch v := f.Value.(type) {
		case pflag.SliceValue:
			if slices.Contains(v.GetSlice(), "") {
				bad = f
			}
		default:
			if f.Value.Type() == "string" && f.Value.String() == "" {
				bad = f
			}
		}
	})
	if bad == nil {
		return nil
	}
	return ui.Errorf(ui.ExitUsage, "--%s was given an empty value", bad.Name).
		Hint("give --%s a value, or leave the flag out (is a shell variable unset?)", bad.Name)
}
