#!/usr/bin/env bash
# The patch series in process, on this machine:
#
#   hack/upstream/bench.sh test          # the allocator's and its CEL package's own
#                                        # unit tests, patched
#   hack/upstream/bench.sh scheduler-test  # kube-scheduler's DynamicResources
#                                        # plugin's unit tests, patched
#   hack/upstream/bench.sh bench [ARGS]  # hwdra's fleet benchmarks against the
#                                        # patched allocator (ARGS go to go test;
#                                        # default: -bench 'Fleet' -benchtime=3x)
#
# bench builds internal/agent/slices/resources with -tags
# hwdra_patched_allocator through a go.work that replaces
# k8s.io/dynamic-resource-allocation with the patched sources (tree.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}
tree=$(hack/upstream/tree.sh)
dra="$tree/staging/src/k8s.io/dynamic-resource-allocation"
case "${1:-}" in
test)
  cd "$dra"
  export GOWORK=off
  exec go test -count=1 ./structured/... ./cel/...
  ;;
scheduler-test)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  plugin=k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources
  hack/upstream/module.sh "$work" "$tree" "$plugin"
  cd "$work"
  GOWORK=off go test -count=1 "$plugin"
  ;;
bench)
  shift
  [ $# -gt 0 ] || set -- -bench Fleet -benchtime=3x
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  version=$(go env GOVERSION)
  cat >"$work/go.work" <<WORK
go ${version#go}

use $repo

replace k8s.io/dynamic-resource-allocation => $dra
WORK
  GOWORK="$work/go.work" go test -tags hwdra_patched_allocator -run '^$' "$@" ./internal/agent/slices/resources/
  ;;
*)
  echo "usage: hack/upstream/bench.sh test | scheduler-test | bench [go test args]" >&2
  exit 2
  ;;
esac
