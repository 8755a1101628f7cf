#!/usr/bin/env bash
# Builds golangci-lint from its Go module, once per version, into the cache
# beside the real-node binaries and helm. Prints the binary's path.
# About 3 CPU-minutes cold; a version check warm.
set -euo pipefail

LINT_VERSION=${LINT_VERSION:-v2.15.0}

cache=${HWDRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hwdra}
dir="$cache/golangci-lint/${LINT_VERSION}_$(go env GOVERSION)"
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
if [ ! -x "$dir/golangci-lint" ]; then
  echo "build-lint: building golangci-lint $LINT_VERSION" >&2
  # Its own module graph, not ours: no GOFLAGS from the caller.
  GOBIN="$dir" CGO_ENABLED=0 GOFLAGS= go install -trimpath \
    "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$LINT_VERSION" >&2
fi
echo "$dir/golangci-lint"
