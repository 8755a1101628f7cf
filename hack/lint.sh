#!/usr/bin/env bash
# Runs golangci-lint (.golangci.yml) over the module.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
lint=$(hack/build-lint.sh)
exec "$lint" run --timeout 30m ./...
