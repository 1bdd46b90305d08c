#!/usr/bin/env bash
# The gateway benchmark: cmcp vs direct, stdio and HTTP upstreams, c=1 and c=8.
# Not part of CI. Usage: bash scripts/bench.sh   (BENCH_CALLS, BENCH_ROUNDS tune it)
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/peers.sh)"
exec go test -run '^$' -bench 'Gateway' -benchtime 1x -timeout 30m ./internal/bench "$@"
