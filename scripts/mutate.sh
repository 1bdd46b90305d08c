#!/usr/bin/env bash
# A mutation check for a claim (docs/CLAIMS.md, "Adding a claim"): break the
# property on purpose and see that the claim's tests fail.
#
#   bash scripts/mutate.sh FILE 'OLD' 'NEW' [go test arguments...]
#   bash scripts/mutate.sh internal/config/listen.go 'if !ip.IsLoopback()' 'if false' \
#       -run 'TestListen' ./internal/config
#
# It replaces the one occurrence of OLD in FILE with NEW, runs
# `go test -count=1 ARGS...`, and restores FILE whatever happens. It exits 0
# when the tests failed (the mutation was caught), 1 when they passed (the
# tests do not prove the property), 2 when OLD is not in FILE exactly once
# or the mutant does not build.
set -uo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
file=$1 old=$2 new=$3
shift 3
cd "$(dirname "$0")/.."
content=$(cat "$file"; printf x) || exit 2
content=${content%x}
rest=${content//"$old"/}
n=$(( (${#content} - ${#rest}) / ${#old} ))
if [ "$n" != 1 ]; then
  echo "mutate.sh: $file holds the text to replace $n times, want exactly once" >&2
  exit 2
fi
backup=$(mktemp)
cp -p "$file" "$backup"
trap 'cp -p "$backup" "$file"; rm -f "$backup"' EXIT INT TERM
printf '%s' "${content/"$old"/"$new"}" > "$file"
if ! go vet "./$(dirname "$file")" >/dev/null 2>&1; then
  echo "mutate.sh: the mutant of $file does not build" >&2
  exit 2
fi
echo "mutate.sh: $file: '$old' -> '$new'; go test -count=1 $*" >&2
if go test -count=1 "$@"; then
  echo "mutate.sh: NOT CAUGHT: the tests passed with the property broken" >&2
  exit 1
fi
echo "mutate.sh: caught: the tests failed with the property broken" >&2
exit 0
