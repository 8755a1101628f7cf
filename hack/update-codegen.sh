#!/usr/bin/env bash
# Generates the deep copies of the versioned API types (api/*/v1alpha1:
# zz_generated.deepcopy.go) with deepcopy-gen from k8s.io/code-generator,
# at the version of the k8s.io modules we build against. Run it after
# changing a type; hack/verify-codegen.sh (CI) fails when a generated file
# is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(go list -m -f '{{.Version}}' k8s.io/apimachinery)
mapfile -t pkgs < <(go list ./api/... | grep '/v[0-9][a-z0-9]*$')
go run "k8s.io/code-generator/cmd/deepcopy-gen@$version" \
  --go-header-file hack/boilerplate.go.txt \
  --output-file zz_generated.deepcopy.go \
  "${pkgs[@]}"
