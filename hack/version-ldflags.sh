#!/usr/bin/env bash
# Prints the -X linker flags that stamp hwdra's version and commit into the
# binary: `go build -ldflags "$(hack/version-ldflags.sh)" ./cmd/hwdra`.
# Go stamps the commit itself only when it builds inside a git checkout
# with VCS stamping on; a build from a tarball, in a container without
# .git or with -buildvcs=false says "commit unknown" without these.
# The version is $HWDRA_VERSION, else the chart's appVersion.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${HWDRA_VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' deploy/helm/hwdra/Chart.yaml)}
flags="-X main.version=$version"
if commit=$(git rev-parse HEAD 2>/dev/null); then
  git diff --quiet HEAD -- 2>/dev/null || commit+=" (with uncommitted changes)"
  flags+=" -X 'main.commit=$commit'"
fi
echo "$flags"
