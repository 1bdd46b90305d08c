#!/usr/bin/env bash
# The test command. README.md gives it and .ci/run calls it, unchanged.
# It installs the real MCP peers first (scripts/peers.sh: Node 22, the MCP
# conformance suite, server-everything, go-sdk's everything-server; cached in
# $HOME/.cache/cmcp-peers, so later runs skip the downloads).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

echo "== peers"
eval "$(bash scripts/peers.sh)"

echo "== go vet"
go vet ./...
go vet -tags peers ./...

echo "== MCP conformance suite against cmcp serve"
bash scripts/conformance.sh

echo "== go test"
go test -race -count=1 -tags peers ./...
