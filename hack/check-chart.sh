#!/usr/bin/env bash
# Chart checks for CI: lint and render the chart with its default values and
# with a test cluster's (deploy/helm/hwdra/ci/*-values.yaml), and check that
# deploy/hwdra.yaml is the chart's rendering (hack/render-deploy.sh). The
# real-node suite server-side dry-runs every rendered object
# (TestChartObjectsDryRun).
set -euo pipefail
cd "$(dirname "$0")/.."
helm=${HELM:-$(hack/build-helm.sh)}
chart=deploy/helm/hwdra
"$helm" lint --strict "$chart"
# Every Kubernetes minor the chart installs on (kubeVersion: 1.36 and 1.37;
# hack/e2e-previous-minor.sh runs the core scenarios on 1.36) renders the
# same objects, with each test cluster's values too.
for kube in v1.36.0 v1.37.0; do
  rendered=$("$helm" template hwdra "$chart" -n hwdra-system --kube-version "$kube")
  [ "$kube" = v1.36.0 ] && first=$rendered
  [ "$rendered" = "$first" ] || { echo "check-chart: the chart renders differently on $kube than on v1.36.0"; exit 1; }
  for values in "$chart"/ci/*-values.yaml; do
    "$helm" lint --strict "$chart" -f "$values" --kube-version "$kube" >/dev/null
    "$helm" template hwdra "$chart" -n hwdra-system --kube-version "$kube" -f "$values" >/dev/null
  done
done
# An older cluster is refused by name, before anything is installed.
if out=$("$helm" template hwdra "$chart" --kube-version v1.35.4 2>&1); then
  echo "check-chart: Kubernetes v1.35.4 was accepted (kubeVersion says 1.36 and later)"; exit 1
fi
grep -q 'chart requires kubeVersion: >=1.36.0-0 which is incompatible with Kubernetes v1.35.4' <<<"$out" ||
  { echo "check-chart: unclear refusal of Kubernetes v1.35.4: $out"; exit 1; }
# Bad values are refused with a message that names them.
if out=$("$helm" template hwdra "$chart" --set hardware=gpu 2>&1); then
  echo "check-chart: hardware=gpu was accepted"; exit 1
fi
grep -q 'hardware: "gpu": want host or mock:<profile>' <<<"$out" || { echo "check-chart: unclear error for hardware=gpu: $out"; exit 1; }
# An extended resource name the API server would refuse is a render error
# that names the value, not an object the apply refuses.
for bad in "extendedResources.gpu=gpu|extendedResources.gpu: \"gpu\" is no extended resource name" \
  "extendedResources.gpu=kubernetes.io/gpu|extendedResources.gpu: \"kubernetes.io/gpu\" is no extended resource name" \
  "extendedResources.migProfiles={1g.10gb+me}|extendedResources.migProfiles: \"1g.10gb+me\" is no MIG profile name" \
  "extendedResources.shared=gpu.shared|extendedResources.shared: \"gpu.shared\" is no extended resource name" \
  "extendedResources.shared=nvidia.com/gpu|extendedResources.shared: nvidia.com/gpu is named twice (also by extendedResources.gpu)" \
  "extendedResources.classes[0].name=example.com/x,extendedResources.classes[0].class=gpu.example.com|extendedResources.classes[0].class: \"gpu.example.com\" is none of the chart's DeviceClasses" \
  "extendedResources.classes[0].name=example.com/x,extendedResources.classes[0].class=gpu.hwdra.io|extendedResources.classes[0].class: gpu.hwdra.io already has extendedResourceName nvidia.com/gpu"; do
  if out=$("$helm" template hwdra "$chart" --set "${bad%%|*}" 2>&1); then
    echo "check-chart: ${bad%%|*} was accepted"; exit 1
  fi
  grep -qF "${bad#*|}" <<<"$out" || { echo "check-chart: unclear error for ${bad%%|*}: $out"; exit 1; }
done
# A value the chart does not have (a --set typo) is refused, not ignored
# (values.schema.json), and so is a value of the wrong type or one the
# field does not take (gpus.settings is Manage or Leave).
for bad in imag.tag=x image.pullpolicy=Never metricsPort=http config.nics[0].mod=shared config.gpus.settings=leave \
  extendedResources.classes[0].name=example.com/x extendedResources.classes[0].clas=gpu.hwdra.io; do
  if out=$("$helm" template hwdra "$chart" --set "$bad" 2>&1); then
    echo "check-chart: --set $bad was accepted"; exit 1
  fi
  grep -q 'values don.t meet the specifications of the schema' <<<"$out" || { echo "check-chart: unclear error for --set $bad: $out"; exit 1; }
done
# The claim-limits policy is there by default and gone with gpusPerNode 0.
# (grep -q on a here-string: on a pipe it may stop reading first, and
# pipefail would blame helm.)
grep -q '^  name: hwdra-agent-claim-limits$' <<<"$("$helm" template hwdra "$chart")" ||
  { echo "check-chart: no claim-limits policy with the default values"; exit 1; }
if grep -q 'claim-limits' <<<"$("$helm" template hwdra "$chart" --set claimLimits.gpusPerNode=0)"; then
  echo "check-chart: claimLimits.gpusPerNode=0 still renders the claim-limits policy"; exit 1
fi
# The VF policy's admission part is there by default and refuses what no
# PF allows; what config.vfPolicy allows somewhere it lets through; a VLAN
# the agent would refuse is refused by the schema or the template, by name.
vf=$("$helm" template hwdra "$chart" --show-only templates/vf-policy.yaml)
for want in "name: hwdra-agent-vf-policy" "trust: true (no PF lets claims set it" "allowedVLANs: none"; do
  grep -qF "$want" <<<"$vf" || { echo "check-chart: the default VF policy lacks \"$want\""; exit 1; }
done
vf=$("$helm" template hwdra "$chart" --show-only templates/vf-policy.yaml --set config.vfPolicy.pfs[0].allowTrust=true --set 'config.vfPolicy.allowedVLANs={100,200-299}')
if grep -qF "trust: true (no PF" <<<"$vf" || ! grep -qF "allowedVLANs: 100, 200-299" <<<"$vf"; then
  echo "check-chart: config.vfPolicy's allowances are not what the VF policy lets through"; exit 1
fi
for bad in "config.vfPolicy.allowedVLANs={4095}|values don.t meet the specifications of the schema" \
  "config.vfPolicy.allowedVLANs={300-200}|config.vfPolicy: allowedVLANs \"300-200\": want a VLAN ID (0 to 4094) or a range from the lower to the higher"; do
  if out=$("$helm" template hwdra "$chart" --set "${bad%%|*}" 2>&1); then
    echo "check-chart: ${bad%%|*} was accepted"; exit 1
  fi
  grep -q "${bad#*|}" <<<"$out" || { echo "check-chart: unclear error for ${bad%%|*}: $out"; exit 1; }
done
# The notes after install say how to check the agent.
grep -q 'rollout status daemonset/hwdra-agent' <<<"$("$helm" install hwdra "$chart" -n hwdra-system --dry-run=client 2>&1)" ||
  { echo "check-chart: NOTES.txt does not say how to check the agent"; exit 1; }
# The notes name every DeviceClass the chart renders, the optional MIG
# classes too (both come from hwdra.deviceClasses in _helpers.tpl).
for set in "" "extendedResources.migProfiles={1g.10gb,3g.40gb}"; do
  out=$("$helm" install hwdra "$chart" -n hwdra-system --dry-run=client ${set:+--set "$set"} 2>&1)
  rendered=$(awk '/^NOTES:/ {exit} /^kind: DeviceClass$/ {dc=1; next} dc && /^  name: / {print $2; dc=0}' <<<"$out" | sort)
  noted=$(awk '/^NOTES:/ {n=1} n && /^DeviceClasses for claims/ {d=1; next} d && /^  [a-z0-9.-]+: / {sub(":", "", $1); print $1}' <<<"$out" | sort)
  if [ -z "$rendered" ] || [ "$rendered" != "$noted" ]; then
    echo "check-chart: NOTES.txt names other DeviceClasses than the chart renders (${set:-default values}):"
    diff <(echo "$rendered") <(echo "$noted") || true
    exit 1
  fi
done
# The notes say which extended resource each class serves.
grep -qF 'share.gpu.hwdra.io: GPU shares, policed, for pods asking for nvidia.com/gpu.shared' \
  <<<"$("$helm" install hwdra "$chart" -n hwdra-system --dry-run=client --set extendedResources.shared=nvidia.com/gpu.shared 2>&1)" ||
  { echo "check-chart: NOTES.txt does not say that share.gpu.hwdra.io serves extendedResources.shared"; exit 1; }
# Monitoring: the PodMonitor and PrometheusRule only when asked for (they
# need the Prometheus operator's CRDs), the dashboard's ConfigMap by
# default, labelled for Grafana's sidecar, holding the dashboard's JSON;
# a scrape interval Prometheus would refuse is refused here.
out=$("$helm" template hwdra "$chart" -n hwdra-system)
if grep -qE '^kind: (PodMonitor|PrometheusRule)$' <<<"$out"; then
  echo "check-chart: a PodMonitor or PrometheusRule renders by default"; exit 1
fi
grep -q '^    grafana_dashboard: "1"$' <<<"$("$helm" template hwdra "$chart" --show-only templates/dashboard.yaml)" ||
  { echo "check-chart: no dashboard ConfigMap labelled grafana_dashboard by default"; exit 1; }
monitoring=(--set monitoring.podMonitor.enabled=true --set monitoring.prometheusRule.enabled=true --set monitoring.podMonitor.labels.release=kps)
"$helm" lint --strict "$chart" "${monitoring[@]}" >/dev/null
out=$("$helm" template hwdra "$chart" -n hwdra-system "${monitoring[@]}")
for kind in PodMonitor PrometheusRule; do
  grep -q "^kind: $kind$" <<<"$out" || { echo "check-chart: monitoring enabled renders no $kind"; exit 1; }
done
if "$helm" template hwdra "$chart" --set monitoring.podMonitor.interval=30 >/dev/null 2>&1; then
  echo "check-chart: monitoring.podMonitor.interval=30 (no unit) was accepted"; exit 1
fi
# That the schema and the templates refuse every config the agent refuses
# is deploy/chart's TestChartRefusesWhatTheAgentRefuses (go test, helm's
# library in process).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp deploy/hwdra.yaml "$tmp/committed.yaml"
HELM="$helm" hack/render-deploy.sh >/dev/null
if ! diff -u "$tmp/committed.yaml" deploy/hwdra.yaml; then
  cp "$tmp/committed.yaml" deploy/hwdra.yaml
  echo "check-chart: deploy/hwdra.yaml is stale: run hack/render-deploy.sh"; exit 1
fi
echo "check-chart: chart lints and renders with default and test values; deploy/hwdra.yaml is current"
