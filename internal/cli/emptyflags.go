package cli

import (
	"slices"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
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
	return exitcode.Errorf(exitcode.ExitUsage, "--%s was given an empty value", bad.Name).
		Hint("give --%s a value, or leave the flag out (is a shell variable unset?)", bad.Name)
}

// annotationPassthroughArgs marks a command whose positional arguments are
// passed on as they are (spawn-digest's COMMAND ARGS), so may be empty.
const annotationPassthroughArgs = "cmcp.passthrough-args"

// rejectEmptyArgs refuses an empty positional argument (`verify-chain ""`):
// it names no file, and the error it would cause later ("stat : no such file
// or directory") does not say what is wrong.
func rejectEmptyArgs(cmd *cobra.Command, args []string) error {
	if cmd.Annotations[annotationPassthroughArgs] != "" || isCompletion(cmd) {
		return nil
	}
	if i := slices.Index(args, ""); i >= 0 {
		return exitcode.Errorf(exitcode.ExitUsage, "argument %d of %s is empty", i+1, cmd.CommandPath()).
			Hint("give a path, or leave the argument out (is a shell variable unset?)")
	}
	return nil
}

// isCompletion reports whether cmd is cobra's hidden completion request
// (cmcp __complete ARGS... WORD): shells pass the word being completed as
// its last argument, empty at the start of a word.
func isCompletion(cmd *cobra.Command) bool {
	return cmd.Name() == cobra.ShellCompRequestCmd || cmd.Name() == cobra.ShellCompNoDescRequestCmd
}
