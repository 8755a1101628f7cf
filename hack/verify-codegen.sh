#!/usr/bin/env bash
# Fails when a generated file (hack/update-codegen.sh) is not what the
# generator makes from the current types.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mapfile -t files < <(git ls-files 'api/*zz_generated.*.go')
for f in "${files[@]}"; do
  mkdir -p "$tmp/$(dirname "$f")" && cp "$f" "$tmp/$f"
done
hack/update-codegen.sh
stale=0
for f in $(git ls-files --others --modified 'api/*zz_generated.*.go') "${files[@]}"; do
  if [ ! -e "$tmp/$f" ]; then
    echo "verify-codegen: $f is generated but not committed"; stale=1
  elif ! diff -u "$tmp/$f" "$f"; then
    cp "$tmp/$f" "$f"
    echo "verify-codegen: $f is stale"; stale=1
  fi
done
if [ "$stale" = 1 ]; then
  echo "verify-codegen: run hack/update-codegen.sh and commit the result"; exit 1
fi
echo "verify-codegen: generated files are current"
