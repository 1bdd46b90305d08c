#!/usr/bin/env bash
# Runs the MCP conformance suite (@modelcontextprotocol/conformance, every
# server scenario of --suite all) against `cmcp serve` fronting go-sdk's
# conformance everything-server as a measured stdio upstream with namespacing
# off, then stops the gateway with SIGTERM and verifies the audit log the run
# wrote. Needs the peers:
#
#   eval "$(bash scripts/peers.sh)"; bash scripts/conformance.sh
#
# The suite's output goes to stdout (the CI log); its per-scenario
# checks.json files stay in $CONFORMANCE_OUT when that is set.
set -euo pipefail
cd "$(dirname "$0")/.."

for v in CMCP_NODE22 CMCP_CONFORMANCE_JS CMCP_EVERYTHING_SERVER; do
  if [ -z "${!v:-}" ]; then
    echo "conformance: $v is not set; run: eval \"\$(bash scripts/peers.sh)\"" >&2
    exit 2
  fi
done

work="$(mktemp -d)"
out="${CONFORMANCE_OUT:-$work/results}"
gw_pid=""
cleanup() {
  if [ -n "$gw_pid" ] && kill -0 "$gw_pid" 2>/dev/null; then
    kill -TERM "$gw_pid" 2>/dev/null || true
    wait "$gw_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== conformance: build cmcp"
go build -o "$work/cmcp" ./cmd/cmcp
cmcp="$work/cmcp"

# The upstream, measured: the gateway refuses to spawn it unless its bytes
# match this digest (a plain SHA-256 of the file, as `cmcp spawn-digest`
# prints it).
pin="sha256:$(sha256sum "$(readlink -f "$CMCP_EVERYTHING_SERVER")" | cut -d' ' -f1)"

{
  echo "version: 1"
  echo "server:"
  echo "  listen: 127.0.0.1:0"
  echo "  tee: software"
  echo "audit:"
  echo "  dir: $work/audit"
  echo "  durability: interval"
  echo "upstreams:"
  echo "  - name: everything"
  echo "    stdio:"
  echo "      command: $CMCP_EVERYTHING_SERVER"
  echo "    pin:"
  echo "      command: $pin"
  echo "    namespace: false"
} >"$work/cmcp.yaml"

echo "== conformance: cmcp serve (everything-server as a measured stdio upstream, namespacing off)"
"$cmcp" serve -c "$work/cmcp.yaml" >"$work/serve.log" 2>&1 &
gw_pid=$!
url=""
for _ in $(seq 1 200); do
  url="$(sed -n 's/.*msg="serving MCP" endpoint=\([^ ]*\).*/\1/p' "$work/serve.log" | head -n1)"
  [ -n "$url" ] && break
  if ! kill -0 "$gw_pid" 2>/dev/null; then
    echo "conformance: cmcp serve exited:" >&2
    cat "$work/serve.log" >&2
    exit 1
  fi
  sleep 0.05
done
if [ -z "$url" ]; then
  echo "conformance: cmcp serve did not start serving:" >&2
  cat "$work/serve.log" >&2
  exit 1
fi
echo "cmcp serves $url"

echo "== conformance: suite all"
set +e
"$CMCP_NODE22" "$CMCP_CONFORMANCE_JS" server --url "$url" --suite all -o "$out" 2>&1 | tee "$work/suite.log"
rc=${PIPESTATUS[0]}
set -e
echo

# A second, independent client: the MCP Inspector CLI (its 1.0.3 build
# resolves ../package.json from the working directory, hence the cd).
if [ -n "${CMCP_INSPECTOR_CLI_DIR:-}" ]; then
  echo "== conformance: MCP Inspector CLI through cmcp"
  (cd "$CMCP_INSPECTOR_CLI_DIR" && "$CMCP_NODE22" index.js "$url" --method tools/call --tool-name test_simple_text) | tee "$work/inspector.json"
  echo
  if ! grep -q 'This is a simple text response for testing' "$work/inspector.json"; then
    echo "conformance: the Inspector CLI did not get test_simple_text's answer through cmcp" >&2
    exit 1
  fi
fi

kill -TERM "$gw_pid"
if ! wait "$gw_pid"; then
  echo "conformance: cmcp serve did not exit cleanly on SIGTERM; gateway log:" >&2
  tail -n 60 "$work/serve.log" >&2
  gw_pid=""
  exit 1
fi
gw_pid=""
if [ "$rc" -ne 0 ] || ! grep -Eq '^Total: [0-9]+ passed, 0 failed' "$work/suite.log"; then
  echo "conformance: the suite failed (exit $rc); gateway log:" >&2
  tail -n 60 "$work/serve.log" >&2
  exit 1
fi

echo "== conformance: verify-chain on the run's audit log"
"$cmcp" verify-chain "$work/audit"
