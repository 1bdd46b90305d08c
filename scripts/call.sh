#!/usr/bin/env bash
# Calls one tool through a running gateway with nothing but curl:
#   scripts/call.sh files__echo '{"text":"hello"}'
#   scripts/call.sh --list
# CMCP_URL (default http://127.0.0.1:8080/mcp) and CMCP_TOKEN (a bearer token,
# if the gateway has tokens) are read from the environment.
set -euo pipefail
url=${CMCP_URL:-http://127.0.0.1:8080/mcp}
hdr=(-H "Content-Type: application/json" -H "Accept: application/json, text/event-stream")
if [ -n "${CMCP_TOKEN:-}" ]; then hdr+=(-H "Authorization: Bearer $CMCP_TOKEN"); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=$(curl -sS -D "$tmp/h" -o "$tmp/b" -w '%{http_code}' "${hdr[@]}" "$url" \
  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"call.sh","version":"1"}}}') ||
  { echo "call.sh: cannot reach $url (is cmcp serve running? CMCP_URL sets the address)" >&2; exit 1; }
sid=$(tr -d '\r' <"$tmp/h" | sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: //p')
if [ -z "$sid" ]; then
  echo "call.sh: $url answered HTTP $status without a session:" >&2
  cat "$tmp/b" >&2; echo >&2
  [ "$status" = 401 ] && echo "call.sh: set CMCP_TOKEN to an agent token of the gateway" >&2
  exit 1
fi
hdr+=(-H "Mcp-Session-Id: $sid" -H "Mcp-Protocol-Version: 2025-11-25")
curl -sS "${hdr[@]}" "$url" -d '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
if [ "${1:-}" = "--list" ]; then
  body='{"jsonrpc":"2.0","id":2,"method":"tools/list"}'
else
  body=$(printf '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"%s","arguments":%s}}' "$1" "${2:-{\}}")
fi
# The answer is one JSON body, or an SSE stream whose data lines are the
# messages (notifications first, the response last): print the messages.
{ curl -sS "${hdr[@]}" "$url" -d "$body"; echo; } | tr -d '\r' | sed -e '/^event: /d' -e '/^id: /d' -e '/^retry: /d' -e 's/^data: //' -e '/^$/d'
curl -sS -X DELETE "${hdr[@]}" "$url" >/dev/null || true
