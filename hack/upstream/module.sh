#!/usr/bin/env bash
# Makes DIR a Go module that builds k8s.io/kubernetes from TREE (the
# patched sources of tree.sh): k8s.io/kubernetes and
# k8s.io/dynamic-resource-allocation from TREE, the other staging modules
# at K8S_STAGING_VERSION from the module proxy, and IMPORTS (packages) in
# a tools file so that `go mod tidy` resolves them and their tests' needs.
#
#   hack/upstream/module.sh DIR TREE PACKAGE...
#
# Used by hack/build-patched-scheduler.sh and hack/upstream/bench.sh.
set -euo pipefail
dir=$1 tree=$2
shift 2
K8S_VERSION=${K8S_VERSION:-v1.37.2}
K8S_STAGING_VERSION=${K8S_STAGING_VERSION:-v0.${K8S_VERSION#v1.}}
mkdir -p "$dir" && cd "$dir"
go mod init hwdra.local/patchedkubernetes >/dev/null 2>&1
{
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo "replace k8s.io/kubernetes => $tree"
  grep -E '^\s*k8s.io/[a-z0-9-]+ => ./staging/' "$tree/go.mod" |
    awk -v v="$K8S_STAGING_VERSION" -v t="$tree" '{
      if ($1 == "k8s.io/dynamic-resource-allocation") print "replace " $1 " => " t "/staging/src/" $1;
      else print "replace " $1 " => " $1 " " v }'
} >>go.mod
{
  echo "package tools"
  echo
  echo "import ("
  for p in "$@"; do echo "	_ \"$p\""; done
  echo ")"
} >tools_test.go
go mod tidy >&2
