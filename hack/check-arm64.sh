#!/usr/bin/env bash
# The arm64 build runs (Grace nodes: GH200, GB200), checked on an amd64
# machine under qemu-user:
#
# - hwdra cross-built for linux/arm64 (cgo, Debian's gcc-aarch64-linux-gnu):
#   `hwdra version`, and the lab on a mock DGX H100 with every example claim
#   whose preparation runs no helper program, each prepared and unprepared
#   as on amd64. The MPS and time-slicing examples are left out: the mock
#   runs the driver's programs (nvidia-cuda-mps-control, nvidia-smi) by
#   re-executing itself, and an arm64 program can exec another only where
#   the kernel hands arm64 binaries to qemu (binfmt_misc), which is the host
#   kernel's setting, not this script's to change.
# - the agent's arm64 image from the index hack/build-image.sh writes: its
#   /hwdra and /nvidia-cdi-hook run from the image's own files (the arm64
#   loader and glibc in it, qemu's -L rooted in the unpacked image).
#
# About 2-3 minutes cold on 2 cores (the cross build), seconds warm.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in qemu-aarch64 aarch64-linux-gnu-gcc; do
  command -v "$tool" >/dev/null || {
    echo "check-arm64: needs $tool (Debian: apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)" >&2
    exit 1
  }
done
export CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

GOARCH=arm64 CC=aarch64-linux-gnu-gcc go build -trimpath -o "$work/hwdra" ./cmd/hwdra
run() { qemu-aarch64 -L /usr/aarch64-linux-gnu "$work/hwdra" "$@"; }
run version | grep -q '^go: .* linux/arm64$' || { echo "check-arm64: hwdra version under qemu:"; run version; exit 1; }

claims=(gpu-full mig-1g.10gb mig-on-distinct-gpus first-available vf-share-10g vf-configured gpu-and-vf-same-numa)
files=()
for c in "${claims[@]}"; do files+=("deploy/examples/$c.yaml"); done
if ! run lab --hardware mock:dgx-h100 --claim "${files[@]}" docs/examples/device-plugin-pod.yaml >"$work/lab.out" 2>&1; then
  echo "check-arm64: the arm64 lab failed:"; cat "$work/lab.out"; exit 1
fi
for c in "${claims[@]}"; do
  name=$(sed -n 's/^  name: //p' "deploy/examples/$c.yaml" | head -n 1)
  grep -q "^$name: unprepared" "$work/lab.out" || { echo "check-arm64: $name was not prepared and unprepared:"; cat "$work/lab.out"; exit 1; }
done
grep -q '^no GPU instances or MIG modes differ from the start$' "$work/lab.out" ||
  { echo "check-arm64: the arm64 lab left the mock changed:"; cat "$work/lab.out"; exit 1; }

archive=$(HWDRA_IMAGE_OUTPUT="$work/image" HWDRA_IMAGE_REPOSITORY=localhost/hwdra-arm64-check hack/build-image.sh 2>"$work/image.log" | tail -n 1) ||
  { cat "$work/image.log"; exit 1; }
root="$work/root"
go run ./hack/ociarchive unpack --archive "$archive" --platform linux/arm64 --dir "$root"
qemu-aarch64 -L "$root" "$root/hwdra" version | grep -q '^go: .* linux/arm64$' ||
  { echo "check-arm64: the arm64 image's /hwdra does not run from the image's files"; exit 1; }
qemu-aarch64 -L "$root" "$root/nvidia-cdi-hook" --version >/dev/null ||
  { echo "check-arm64: the arm64 image's /nvidia-cdi-hook does not run"; exit 1; }
echo "check-arm64: ok: hwdra (version, lab: ${#claims[@]} example claims and a device-plugin pod) and the arm64 image run under qemu-aarch64"
