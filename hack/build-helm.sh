#!/usr/bin/env bash
# Builds the helm CLI from its Go module (helm.sh/helm/v4), once per version,
# into the cache beside the real-node binaries. Prints the binary's path.
# The chart checks (hack/check-chart.sh) and the real-node suite use it; no
# prebuilt download, no registry.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v4.3.2}

cache=${HWDRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hwdra}
dir="$cache/helm/${HELM_VERSION}_$(go env GOVERSION)"
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
if [ ! -x "$dir/helm" ]; then
  echo "build-helm: building helm $HELM_VERSION" >&2
  GOBIN="$dir" CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
fi
echo "$dir/helm"
