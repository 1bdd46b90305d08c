#!/usr/bin/env bash
# The test command. README.md gives it and .ci/run calls it, unchanged.
# It installs the real MCP peers first (scripts/peers.sh: Node 22, the MCP
# conformance suite, server-everything, go-sdk's everything-server; cached in
# $HOME/.cache/cmcp-peers, so later runs skip the downloads), and ends with
# the line "N passed, N failed" of the go tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the steps below need, checked before the first of them runs (a C
# compiler missing used to show only at the last step, after the downloads
# and the conformance suite).
missing=0
need() { # need TOOL WHY INSTALL
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "test.sh: $1 not found: $2 (install: $3)" >&2
    missing=1
  fi
}
need go "builds and tests cmcp (Go $(sed -n 's/^go //p' go.mod) or newer, go.mod)" "https://go.dev/dl"
need gofmt "checks formatting (it comes with Go)" "https://go.dev/dl"
need git "lists the files to check" "apt-get install git"
need curl "scripts/call.sh, which the quickstart test runs, is curl" "apt-get install curl"
need npm "scripts/peers.sh installs Node 22 and the MCP peers with it" "apt-get install npm"
need flock "scripts/peers.sh serialises concurrent runs with it" "apt-get install util-linux"
if command -v go >/dev/null 2>&1; then
  cc=$(go env CC)
  if ! command -v "${cc%% *}" >/dev/null 2>&1; then
    echo "test.sh: C compiler ${cc%% *} not found: go test -race needs cgo (install: apt-get install gcc, or set CC)" >&2
    missing=1
  elif [ "$(go env CGO_ENABLED)" != 1 ]; then
    echo "test.sh: cgo is disabled (CGO_ENABLED=$(go env CGO_ENABLED)): go test -race needs it (unset CGO_ENABLED)" >&2
    missing=1
  fi
fi
if [ "$missing" != 0 ]; then
  echo "test.sh: nothing was run; install what is missing and run it again (README.md lists what is needed)" >&2
  exit 1
fi

# Each step says how long it took ("-- gofmt: 1 s"), and the last lines
# how long go test and the whole command took: where the time goes.
started=$(date +%s) step="" step_started=$SECONDS
step() { # step NAME: ends the step before (printing its time), starts NAME
  if [ -n "$step" ]; then echo "-- $step: $((SECONDS - step_started)) s"; fi
  step=$1 step_started=$SECONDS
  echo "== $step"
}

step gofmt
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

step "peers"
# Not eval "$(...)": its status is eval's, and a failed install would go on.
peers=$(bash scripts/peers.sh) || { echo "test.sh: scripts/peers.sh failed (see above)" >&2; exit 1; }
eval "$peers"

# One run of go vet and of staticcheck with -tags peers reads every file,
# as long as no file is built only without the tag (a //go:build line with
# !peers); if one ever is, both runs are made.
tagsets=("-tags=peers")
if git grep -qE '^//go:build.*!peers' -- '*.go'; then
  tagsets=("-tags=" "-tags=peers")
fi

# -trimpath, through GOFLAGS so that the builds the tests start (the test
# upstream, sample servers) get it too: a build that does not depend on
# the clone's directory finds what an earlier clone of the same sources
# compiled in Go's build cache (without it a second clone recompiled the
# whole module: ~140 CPU-s of the run). staticcheck's own cache keys on
# the same paths: with -trimpath a new clone of checked sources takes it
# 1 s instead of ~70 CPU-s (a new finding is still reported).
user_goflags=${GOFLAGS:-}
export GOFLAGS="-trimpath${user_goflags:+ $user_goflags}"

summary=$(mktemp -d)
lint=""
cleanup() {
  # The tool it runs (go vet or staticcheck) ends by itself: not waited for.
  if [ -n "$lint" ]; then kill "$lint" 2>/dev/null || true; fi
  rm -rf "$summary"
}
trap cleanup EXIT

step "go vet and staticcheck, alongside the steps below"
# They use the cores while the conformance suite and the test packages
# mostly wait (on children, the network, timers). Their output is printed
# at the end, before the last line, and a finding fails the run there.
# Zero findings, test files and the peers tag included. go-sdk's logging,
# sampling and roots deprecations (SEP-2577) have no replacement: the files
# that relay them say so with //lint:file-ignore SA1019.
(
  trap 'echo $? >"$summary/lint.tmp" && mv "$summary/lint.tmp" "$summary/lint.status"' EXIT
  set -e
  t0=$SECONDS
  for tags in "${tagsets[@]}"; do go vet "$tags" ./...; done
  echo "-- go vet: $((SECONDS - t0)) s"
  t0=$SECONDS
  for tags in "${tagsets[@]}"; do "$CMCP_STATICCHECK" "$tags" ./...; done
  echo "-- staticcheck: $((SECONDS - t0)) s"
) >"$summary/lint.log" 2>&1 &
lint=$!

step "MCP conformance suite against cmcp serve"
bash scripts/conformance.sh

step "go test"
# go test -json through scripts/testsummary.go: the output of go test
# without -v, then one last line "N passed, N failed". -timeout 25m: a
# package of timing tests on a loaded 2-core machine ran past the default 10m.
go build -o "$summary/testsummary" scripts/testsummary.go
# go test starts the test binaries in the order the packages are named, -p
# at a time: the longest packages are named first, so that the run does not
# end waiting for one of them started last (./... names each package once,
# in its own order, after them).
# -p is twice the cores, not go test's default of the cores: the long
# packages mostly wait (on children, sockets, timers: internal/gateway's
# tests take 116 s but 61 CPU-s alone), so two at a time left the cores
# idle. On 2 cores, fresh clones: one CPU hog 410 -> 300 s, two hogs
# 524-704 -> 368 s, every test passing.
# nproc: the CPUs this process may run on, as go test counts its default.
jobs=$(( 2 * $(nproc 2>/dev/null || echo 2) ))
first=()
for d in internal/gateway internal/server pkg/auditlog internal/cli . internal/upstream internal/policy pkg/digest internal/replay; do
  if [ -d "$d" ]; then first+=("./$d"); fi
done
# -vet=off: the go vet step above runs every vet analyzer (a superset of
# the few go test runs) over the same packages, test files and tags; go
# test's own pass over each package was the same work done twice.
# -ldflags=-w: the test binaries are linked without DWARF, which nothing
# reads (race reports and panics print from the Go symbol table); it cut
# the CPU of linking the ~35 race test binaries by a quarter.
{
  set +e
  go test -race -vet=off -ldflags=-w -count=1 -p "$jobs" -timeout 25m -tags peers -json "${first[@]}" ./...
  status=$?
  # testsummary prints lines that are not test events as they are; a
  # failed go vet or staticcheck counts as one failure.
  # (Not wait: this pipeline's shell is not their parent.)
  echo "== go vet and staticcheck"
  while [ ! -e "$summary/lint.status" ] && kill -0 "$lint" 2>/dev/null; do sleep 1; done
  lint_status=$(cat "$summary/lint.status" 2>/dev/null || echo "unknown: killed")
  cat "$summary/lint.log"
  if [ "$lint_status" != 0 ]; then
    echo "go vet or staticcheck failed (exit $lint_status): see above"
    echo '{"Action":"fail","Package":"go vet and staticcheck"}'
  fi
  exit "$status"
} | "$summary/testsummary" -started "$started"
