#!/usr/bin/env bash
# Runs the MCP conformance suite (@modelcontextprotocol/conformance, every
# server scenario of --suite all) against `cmcp serve` fronting go-sdk's
# conformance everything-server as a measured stdio upstream with namespacing
# off, then verifies the audit log the run wrote. Needs the peers:
#
#   eval "$(bash scripts/peers.sh)"; bash scripts/conformance.sh
#
# The suite's output goes to stdout (the CI log); its per-scenario
# checks.json files stay in $CONFORMANCE_OUT (default: a temp dir).
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

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
cat >"$work/cmcp.yaml" <<EOF
version: 1
upstreams:
  - name: everything
    stdio:
      command: $CMCP_EVERYTHING_SERVER
    pin:
      command: $pin
    namespace: false
EOF

echo "== conformance: cmcp serve on 127.0.0.1:$port"
"$cmcp" serve --config "$work/cmcp.yaml" --listen "127.0.0.1:$port" --audit-dir "$work/audit" >"$work/serve.log" 2>&1 &
gw_pid=$!
for _ in $(seq 1 100); do
  if curl -s -o /dev/null "http://127.0.0.1:$port/mcp"; then break; fi
  if ! kill -0 "$gw_pid" 2>/dev/null; then
    echo "conformance: cmcp serve exited:" >&2; cat "$work/serve.log" >&2; exit 1
  fi
  sleep 0.1
done

echo "== conformance: suite all"
set +e
"$CMCP_NODE22" "$CMCP_CONFORMANCE_JS" server --url "http://127.0.0.1:$port/mcp" --suite all -o "$out" 2>&1 | tee "$work/suite.log"
rc=${PIPESTATUS[0]}
set -e

kill -TERM "$gw_pid"
wait "$gw_pid" || true
gw_pid=""
if [ "$rc" -ne 0 ]; then
  echo "conformance: the suite failed (exit $rc); gateway log:" >&2
  tail -n 60 "$work/serve.log" >&2
  exit 1
fi
if ! grep -Eq '^Total: [0-9]+ passed, 0 failed' "$work/suite.log"; then
  echo "conformance: no clean total line in the suite's output" >&2
  exit 1
fi

echo "== conformance: verify-chain on the run's audit log"
"$cmcp" verify-chain "$work/audit"
