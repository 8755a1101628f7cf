#!/usr/bin/env bash
# Fuzzes the inputs tenants and nodes control (docs/security.md, Fuzzing):
# the opaque configuration decoders, the state files, the lab's manifest
# reading and hwdra convert's CEL rewrite, each target for FUZZTIME (5s by
# default: CI; run it for minutes by hand, e.g. FUZZTIME=5m). A failing
# input is written to the package's testdata/fuzz/<target>/, where plain
# go test runs it from then on: keep it with the fix. Args: targets to
# run (default: all), e.g. hack/fuzz.sh FuzzDecode.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}
fuzztime=${FUZZTIME:-5s}

targets=(
  "./api FuzzDecode"
  "./internal/state FuzzFormatDecode"
  "./internal/state FuzzOpenAnyFile"
  "./internal/tools/lab FuzzReadClaims"
  "./internal/tools/claimspec FuzzFromV1beta"
  "./internal/tools/manifestfiles FuzzExpand"
  "./internal/tools/convert FuzzRewriteCEL"
  "./internal/tools/convert FuzzConvert"
)

# Every fuzz target of the repository is listed: a new one runs in CI too.
listed=$(printf '%s\n' "${targets[@]}" | awk '{print $2}' | sort)
found=$(git grep -h -o '^func Fuzz[A-Za-z0-9_]*' -- '*_test.go' | sed 's/^func //' | sort)
if [ "$listed" != "$found" ]; then
  echo "fuzz: hack/fuzz.sh lists other targets than the repository has:"
  diff <(echo "$listed") <(echo "$found") || true
  exit 1
fi

only=" $* "
start=$SECONDS
ran=0
for t in "${targets[@]}"; do
  read -r pkg name <<<"$t"
  if [ "$only" != "  " ] && [[ "$only" != *" $name "* ]]; then
    continue
  fi
  echo "fuzz: $name ($pkg) for $fuzztime"
  # -parallel 1: one worker, so that CI's cores stay with the rest. The
  # progress lines and the code's own log lines are left out.
  set +e
  go test "$pkg" -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" -parallel 1 2>&1 |
    grep -v -E '^(fuzz: elapsed|[IWE][0-9]{4} )'
  rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" = 0 ] || { echo "fuzz: $name failed: its input is in $pkg/testdata/fuzz/$name/"; exit 1; }
  ran=$((ran + 1))
done
echo "fuzz: $ran targets for $fuzztime each, $((SECONDS - start))s"
