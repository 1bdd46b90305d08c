package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/confidential-mcp/cmcp/internal/buildinfo"
	"github.com/confidential-mcp/cmcp/internal/ui"
)

type versionDoc struct {
	SchemaVersion int `json:"schema_version"`
	buildinfo.Info
}

func newVersionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, build date and Go version",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := e.printer()
			in := buildinfo.Get()
			if p.JSONOut {
				return p.JSON(versionDoc{SchemaVersion: ui.SchemaVersion, Info: in})
			}
			p.Printf("%s", versionText(in, p.Bold))
			return nil
		},
	}
}

// versionText is what `cmcp version` and `cmcp --version` print; bold
// styles the version.
func versionText(in buildinfo.Info, bold func(string) string) string {
	return fmt.Sprintf("cmcp %s\n  commit:   %s\n  built:    %s\n  go:       %s\n  platform: %s\n",
		bold(in.Version), in.Commit, in.Date, in.GoVersion, in.Platform)
}
