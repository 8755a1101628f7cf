#!/usr/bin/env bash
# Runs every test: the unit and mock-hardware tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=1
# go-nvml's cgo preamble uses deprecated NVML symbols; the warnings are noise.
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

go test -count=1 -timeout 20m ./...
