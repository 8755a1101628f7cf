#!/usr/bin/env bash
# Checks hwdra on a machine with a real NVIDIA GPU, as a bare-metal lab
# engineer (or someone lent one for an hour) runs it, and prints a summary:
#
#   1. hwdra doctor: what the agent would find and what blocks it;
#   2. hwdra probe and hwdra slices on --hardware host;
#   3. the lab, under gpus.settings: Leave (the agent changes no MIG mode,
#      compute mode or time slice), for a whole GPU, a GPU share and an
#      MPS claim: each claim prepared for real, its container emulated from
#      its CDI specs (hack/cdirun: runc, the CDI library, an image of a
#      CUDA stand-in program and glibc only) in which the program loads
#      libcuda as CUDA programs do and reports the multiprocessors and free
#      memory its context sees (an MPS client: what its limits leave it),
#      then unprepared; a time-sliced claim, which Leave refuses.
#
# It changes nothing on the GPUs unless HWDRA_CHECK_ALL=1: then every
# example claim runs (MIG partitions are still made only on GPUs already in
# MIG mode, as Leave says). MPS daemons the lab starts are stopped when it
# unprepares; nothing is left running.
#
# Needs root (runc, device nodes), runc (a containerd node has it), and
# either Go 1.26 with gcc (it builds what it runs) or the binaries built
# elsewhere: `hack/realgpu-check.sh --build DIR` builds them into DIR,
# `HWDRA_CHECK_BIN=DIR hack/realgpu-check.sh` runs them (hwdra, cdirun,
# cudaapp, nvidia-cdi-hook; x86-64).
#
# Environment: HWDRA_CHECK_OUT (default: a temporary directory) keeps every
# step's output; HWDRA_CHECK_HARDWARE (default host) is where the lab runs:
# CI runs this script on mock hardware (test/e2e/realgpu_check_test.go).
set -uo pipefail
cd "$(dirname "$0")/.."

build() {
  local dir=$1
  mkdir -p "$dir"
  export CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
  go build -o "$dir/hwdra" ./cmd/hwdra &&
    go build -o "$dir/cdirun" ./hack/cdirun &&
    go build -ldflags "-s -w -linkmode external -extldflags -static" -o "$dir/nvidia-cdi-hook" \
      github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook 2>/dev/null &&
    gcc -O2 -o "$dir/cudaapp" test/e2e/images/cudaapp/cudaapp.c
}

if [ "${1:-}" = --build ]; then
  build "${2:?usage: hack/realgpu-check.sh --build DIR}" && echo "realgpu-check: built into $2" >&2
  exit $?
fi

out=${HWDRA_CHECK_OUT:-$(mktemp -d /tmp/hwdra-realgpu-check.XXXXXX)}
mkdir -p "$out"
hardware=${HWDRA_CHECK_HARDWARE:-host}
bin=${HWDRA_CHECK_BIN:-$out/bin}
if [ -z "${HWDRA_CHECK_BIN:-}" ]; then
  echo "realgpu-check: building hwdra, cdirun, cudaapp and nvidia-cdi-hook into $bin" >&2
  build "$bin" || { echo "realgpu-check: build failed" >&2; exit 1; }
fi
for b in hwdra cdirun cudaapp nvidia-cdi-hook; do
  [ -x "$bin/$b" ] || { echo "realgpu-check: $bin/$b missing" >&2; exit 1; }
done

summary=()
failed=0
# step NAME EXPECT COMMAND...: runs a step into $out/NAME.log; EXPECT is
# ok (must succeed), refused (must fail: what Leave refuses) or report (its
# findings are shown, a non-zero exit fails nothing: doctor's blockers on a
# machine that is no Kubernetes node, such as its kubelet's folders). The
# summary line shows the log's lines that matter (the CUDA stand-in's,
# a refusal's reason).
step() {
  local name=$1 expect=$2
  shift 2
  local log="$out/$name.log" status=OK
  "$@" >"$log" 2>&1
  local rc=$?
  local detail
  detail=$(grep -h -e '^=== CUDA' -e '^=== MPS' -e 'BLOCKER' "$log" | tr '\n' ';' | sed 's/;$//')
  if [ "$expect" = report ]; then
    [ $rc -ne 0 ] && status=NOTE
  elif [ "$expect" = ok ] && [ $rc -ne 0 ] && grep -q 'cannot be allocated on this node' "$log"; then
    status=SKIP detail="does not fit this machine"
  elif [ "$expect" = ok ] && [ $rc -ne 0 ]; then
    status=FAIL
    [ -z "$detail" ] && detail=$(grep -h '^Error:' "$log" | tail -1)
  elif [ "$expect" = refused ]; then
    if [ $rc -eq 0 ]; then
      status=FAIL detail="prepared, but gpus.settings: Leave must refuse it"
    else
      status=OK detail="refused: $(grep -h -o 'gpus.settings[^"]*' "$log" | head -1)"
    fi
  fi
  [ "$status" = FAIL ] && failed=$((failed + 1))
  summary+=("$(printf '%-28s %-5s %s' "$name" "$status" "$detail")")
}

cat >"$out/leave.yaml" <<'EOF'
apiVersion: config.hwdra.io/v1alpha1
kind: AgentConfig
gpus: {settings: Leave}
EOF

step doctor report "$bin/hwdra" doctor --hardware "$hardware" --config "$out/leave.yaml"
"$bin/hwdra" doctor --hardware "$hardware" --config "$out/leave.yaml" -o json >"$out/doctor.json" 2>&1
step probe ok "$bin/hwdra" probe --hardware "$hardware" -o yaml
step slices ok "$bin/hwdra" slices --hardware "$hardware" --config "$out/leave.yaml" --node-name "$(hostname)"

lab() {
  local claim=$1
  shift
  "$bin/hwdra" lab --hardware "$hardware" --config "$out/leave.yaml" --claim "deploy/examples/$claim" \
    --nvidia-cdi-hook "$bin/nvidia-cdi-hook" -- "$bin/cdirun" "$bin/cudaapp" --once
}
examples=(gpu-full.yaml gpu-share.yaml gpu-mps.yaml)
if [ "${HWDRA_CHECK_ALL:-}" = 1 ]; then
  examples=()
  for f in deploy/examples/*.yaml; do
    case $(basename "$f") in gpu-timeslicing.yaml) ;; *) examples+=("$(basename "$f")") ;; esac
  done
fi
for e in "${examples[@]}"; do
  step "lab ${e%.yaml}" ok lab "$e"
done
step "lab gpu-timeslicing" refused lab gpu-timeslicing.yaml

echo
echo "hwdra real-GPU check on $(hostname) (--hardware $hardware), logs in $out:"
printf '%s\n' "${summary[@]}"
if [ $failed -gt 0 ]; then
  echo "$failed step(s) failed"
  exit 1
fi
