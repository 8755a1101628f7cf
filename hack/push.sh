#!/usr/bin/env bash
# Pushes the agent's image (both platforms, one index) and the Helm chart
# (an OCI artifact) to a registry, under one version:
#
#   hack/push.sh REGISTRY/PATH [--plain-http]
#
# gives REGISTRY/PATH/hwdra:VERSION (the image index) and
# oci://REGISTRY/PATH/charts/hwdra VERSION (the chart, whose default image is
# that index), so that
#
#   helm install hwdra oci://REGISTRY/PATH/charts/hwdra --version VERSION -n NAMESPACE
#
# installs the agent with nothing else to set. VERSION is HWDRA_IMAGE_TAG,
# by default the chart's appVersion; it must be semantic (a chart's
# version is). Credentials are docker's (~/.docker/config.json and its
# helpers: `docker login`, `crane auth login`), which helm reads too;
# --plain-http talks HTTP (a registry on this machine).
#
# The image is built by hack/build-image.sh (HWDRA_IMAGE_PLATFORMS and
# HWDRA_IMAGE_SIMULATOR are passed on) unless HWDRA_IMAGE_ARCHIVE names one
# already built of that tag. The image goes with hack/ociarchive
# (go-containerregistry), the chart with `helm package` and `helm push`
# (the helm CLI of hack/build-helm.sh, or HELM).
set -euo pipefail
cd "$(dirname "$0")/.."

dest=${1:-}
plain=
case "${2:-}" in
  "") ;;
  --plain-http) plain=--plain-http ;;
  *) echo "push: unknown option $2 (want --plain-http)" >&2; exit 2 ;;
esac
dest=${dest%/}
# REGISTRY[:PORT][/PATH]: no scheme, and no tag or digest on the path.
if [ -z "$dest" ] || [[ "$dest" == *://* ]] || { [[ "$dest" == */* ]] && [[ "${dest##*/}" == *[:@]* ]]; }; then
  echo "usage: hack/push.sh REGISTRY/PATH [--plain-http]   (e.g. registry.example:5000/gpu, no scheme, no tag)" >&2
  exit 2
fi
chart=deploy/helm/hwdra
tag=${HWDRA_IMAGE_TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$chart/Chart.yaml")}
semver='^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$'
if ! [[ "$tag" =~ $semver ]]; then
  echo "push: version $tag (HWDRA_IMAGE_TAG) is not semantic (MAJOR.MINOR.PATCH[-PRE]): the chart's version must be" >&2
  exit 2
fi
helm=${HELM:-$(hack/build-helm.sh)}
export CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

archive=${HWDRA_IMAGE_ARCHIVE:-}
if [ -z "$archive" ]; then
  archive=$(HWDRA_IMAGE_REPOSITORY="$dest/hwdra" HWDRA_IMAGE_TAG="$tag" hack/build-image.sh | tail -n 1)
fi
go run ./hack/ociarchive push --archive "$archive" --ref "$dest/hwdra:$tag" $plain

# The chart, its default image the one just pushed.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$chart" "$work/hwdra"
values="$work/hwdra/values.yaml"
n=$(grep -c '^  repository: ' "$values" || true)
if [ "$n" != 1 ]; then
  echo "push: $chart/values.yaml has $n lines '  repository: ' (want the one under image:)" >&2
  exit 1
fi
sed -i "s|^  repository: .*|  repository: $dest/hwdra|" "$values"
"$helm" package "$work/hwdra" --version "$tag" --app-version "$tag" -d "$work" >&2
"$helm" push "$work/hwdra-$tag.tgz" "oci://$dest/charts" $plain >&2
echo "push: installed with: helm install hwdra oci://$dest/charts/hwdra --version $tag -n NAMESPACE" >&2
