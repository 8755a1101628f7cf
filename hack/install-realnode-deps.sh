#!/usr/bin/env bash
# Installs the Debian packages the real-node suite needs besides the binaries
# that build-realnode.sh builds: runc (containerd's runtime; Debian's 1.1.5
# works with containerd 2.4.2), iproute2 (network namespaces) and the arm64
# cross compiler (the suite installs the agent from an amd64+arm64 image
# index, as operators do). Root only.
set -euo pipefail
need=()
[ -x /usr/sbin/runc ] || need+=(runc)
command -v ip >/dev/null || need+=(iproute2)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
[ ${#need[@]} -eq 0 ] && exit 0
echo "install-realnode-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
