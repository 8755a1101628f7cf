#!/usr/bin/env bash
# Builds the agent's container image as an OCI image archive (no registry,
# no container engine): one image per platform, linux/amd64 and linux/arm64
# (Grace nodes: GH200, GB200) by default, under one image index.
# `hack/push.sh` pushes it to a registry; `ctr -n k8s.io images import
# --platform linux/amd64 FILE` or `docker load -i FILE` (this machine's
# platform) loads it. Writes it under _output/ and prints its path as the
# last line of output. The arm64 binary is cgo cross-built with Debian's
# gcc-aarch64-linux-gnu and libc6-dev-arm64-cross, whose glibc goes into
# the arm64 image.
#
# The binary is built as the image needs it: -tags nolab (no lab, so no
# scheduler allocator and no CEL in the agent), nomock (no hardware
# simulator: `--hardware mock:...` and `hwdra mock` are refused),
# grpcnotrace (gRPC without x/net/trace and its html/template), -trimpath
# -ldflags='-s -w'. HWDRA_IMAGE_SIMULATOR=1 keeps the simulator in, for
# test clusters whose nodes run on mock hardware (the real-node suite). The image
# holds /hwdra and the glibc files it and the host's libnvidia-ml need
# (hack/buildimage), and NVIDIA's nvidia-cdi-hook beside it (the agent
# installs it on the node for containers' driver files); the NVIDIA
# driver itself comes from the host.
#
# HWDRA_IMAGE_REPOSITORY (default localhost/hwdra), HWDRA_IMAGE_TAG (default
# the chart's appVersion), HWDRA_IMAGE_PLATFORMS (default
# linux/amd64,linux/arm64) and HWDRA_IMAGE_OUTPUT (default _output) change
# what is built where; HWDRA_IMAGE_SIMULATOR=1 builds the test image.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=1
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

repo=${HWDRA_IMAGE_REPOSITORY:-localhost/hwdra}
platforms=${HWDRA_IMAGE_PLATFORMS:-linux/amd64,linux/arm64}
tag=${HWDRA_IMAGE_TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' deploy/helm/hwdra/Chart.yaml)}
out=${HWDRA_IMAGE_OUTPUT:-_output}
mkdir -p "$out/image-$tag"
out=$(cd "$out" && pwd)

# The version is the tag and the commit the checkout's (hack/version-ldflags.sh):
# Go's own VCS stamp is absent where the build has no .git.
tags=nolab,nomock,grpcnotrace
[ "${HWDRA_IMAGE_SIMULATOR:-}" = 1 ] && tags=nolab,grpcnotrace
ldflags="-s -w $(HWDRA_VERSION=$tag hack/version-ldflags.sh)"
host=$(go env GOHOSTARCH)
dirs=()
for platform in ${platforms//,/ }; do
  arch=${platform#linux/}
  case "$platform" in
    linux/amd64) triple=x86_64-linux-gnu ;;
    linux/arm64) triple=aarch64-linux-gnu ;;
    *) echo "build-image: platform $platform: want linux/amd64 or linux/arm64 (HWDRA_IMAGE_PLATFORMS)" >&2; exit 2 ;;
  esac
  # cgo (go-nvml) needs a C compiler for the target: this machine's for
  # its own architecture, Debian's cross compiler for the other.
  cc=${CC:-gcc}
  if [ "$arch" != "$host" ]; then
    cc=$triple-gcc
    if ! command -v "$cc" >/dev/null; then
      echo "build-image: $platform needs $cc (Debian: apt-get install gcc-$triple libc6-dev-$arch-cross), or HWDRA_IMAGE_PLATFORMS=linux/$host" >&2
      exit 1
    fi
  fi
  dir="$out/image-$tag/$arch"
  mkdir -p "$dir"
  GOARCH=$arch CC=$cc go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$dir/hwdra" ./cmd/hwdra
  # NVIDIA's CDI hook, which the container runtime runs for the driver files
  # the agent generates (driverlibs): the toolkit's own, of the version in
  # go.mod, static so that it runs on any node's libc (the linker's warnings
  # about dlopen and getaddrinfo in static programs concern calls the hook's
  # commands that CDI specs name never make).
  GOARCH=$arch CC=$cc go build -trimpath -ldflags "-s -w -linkmode external -extldflags -static" \
    -o "$dir/nvidia-cdi-hook" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
    2> >(grep -v -e 'statically linked applications requires at runtime' -e 'in function .*_cgo_' -e '^# github.com/NVIDIA' >&2)
  dirs+=(--platform-dir "$dir")
done
go run ./hack/buildimage "${dirs[@]}" --beside nvidia-cdi-hook --ref "$repo:$tag" --out "$out/hwdra-$tag.oci.tar"
echo "build-image: $repo:$tag ($platforms), -tags $tags ($(du -h "$out/hwdra-$tag.oci.tar" | cut -f1))" >&2
echo "$out/hwdra-$tag.oci.tar"
