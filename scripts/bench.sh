#!/usr/bin/env bash
# The gateway benchmarks. Not part of CI.
#   bash scripts/bench.sh          cmcp vs direct, stdio and HTTP upstreams, c=1 and c=8 (BenchmarkGateway)
#   bash scripts/bench.sh table    issue 18's table: new sessions, floors, 64 KiB, memory (BenchmarkTable)
# BENCH_CALLS, BENCH_ROUNDS (and BENCH_SESSIONS for table) tune them.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=Gateway
if [ "${1:-}" = table ]; then
  bench=Table
  shift
fi
eval "$(bash scripts/peers.sh)"
exec go test -run '^$' -bench "^Benchmark$bench\$" -benchtime 1x -timeout 30m ./internal/bench "$@"
