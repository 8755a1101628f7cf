#!/usr/bin/env bash
# Runs golangci-lint (.golangci.yml) over the module.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
lint=$(hack/build-lint.sh)
# Parallel runners wait for each other rather than fail (several
# worktrees on one machine share the linter's cache).
exec "$lint" run --timeout 30m --allow-parallel-runners ./...
