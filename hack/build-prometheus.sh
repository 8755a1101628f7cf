#!/usr/bin/env bash
# Builds prometheus and promtool from their Go module
# (github.com/prometheus/prometheus), once per version, into the cache beside
# the real-node binaries. Prints the bin directory on stdout. The real-node
# suite's Prometheus scenario runs prometheus; hack/check-rules.sh runs
# promtool on the chart's rules. No prebuilt download, no registry.
#
# remove_all_sd leaves out every service discovery but the static and file
# ones (the cloud SDKs are most of a cold build): the suite's Prometheus
# scrapes fixed addresses. Without builtinassets the web UI's files are not
# embedded; the HTTP API, which the suite and promtool use, is all there.
# Cold: about 9 minutes on 2 cores (measured on an otherwise idle machine
# would be less; see docs/development.md). Warm: a check only.
set -euo pipefail

PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0} # Prometheus 3.16.0

cache=${HWDRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hwdra}
dir="$cache/prometheus/${PROMETHEUS_VERSION}_$(go env GOVERSION)"
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
if [ ! -x "$dir/prometheus" ] || [ ! -x "$dir/promtool" ]; then
  echo "build-prometheus: building prometheus and promtool $PROMETHEUS_VERSION" >&2
  # The module's v0.3XX.Y is Prometheus 3.XX.Y.
  minor=${PROMETHEUS_VERSION#v0.3}
  version="3.${minor%%.*}.${PROMETHEUS_VERSION##*.}"
  GOBIN="$dir" CGO_ENABLED=0 go install -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$version" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" >&2
fi
echo "$dir"
