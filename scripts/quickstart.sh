#!/usr/bin/env bash
# Builds cmcp and the sample MCP server, pins the server (code and tool
# definitions), writes .quickstart/cmcp.yaml from examples/cmcp.yaml and runs
# the gateway on http://127.0.0.1:8080/mcp. Ctrl-C stops it and seals the log.
set -euo pipefail
# Ctrl-C before the gateway runs stops here, even when the step it hits
# finishes anyway (bash itself stops only if that step dies of the signal).
trap 'exit 130' INT TERM
cd "$(dirname "$0")/.."
mkdir -p bin .quickstart
echo "== build" >&2
# -trimpath, as releases are built (goreleaser.yaml): the binaries, and so
# the sample server's pin, do not depend on where the repository is.
go build -trimpath -o bin/cmcp ./cmd/cmcp
go build -trimpath -o bin/sample-server ./examples/sample-server
echo "== pin the sample server" >&2
# The server runs as cmcp.yaml starts it: in the repository root (its dir:),
# reading examples/ only.
doc=$(bin/cmcp spawn-digest --tools --name files --output json -- bin/sample-server --root examples)
pin=$(printf '%s\n' "$doc" | sed -n 's/.*"command_digest": *"\(sha256:[0-9a-f]*\)".*/\1/p' | head -1)
# tools_flow is a JSON string holding YAML whose keys are quoted: unescape them.
tools=$(printf '%s\n' "$doc" | sed -n 's/.*"tools_flow": *"\(.*\)".*/\1/p' | head -1 | sed 's/\\"/"/g')
echo "   command pin $pin" >&2
echo "   tool pins   $tools" >&2
sed -e "s|PIN_COMMAND|$pin|" -e "s|PIN_TOOLS|$tools|" examples/cmcp.yaml > .quickstart/cmcp.yaml
echo "== cmcp serve -c .quickstart/cmcp.yaml (audit log in audit/)" >&2
trap - INT TERM
exec bin/cmcp serve -c .quickstart/cmcp.yaml "$@"
