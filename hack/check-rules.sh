#!/usr/bin/env bash
# The chart's Prometheus rules (deploy/helm/hwdra/files/prometheus-rules.yaml)
# through promtool, built from its Go module like the real-node binaries
# (hack/build-prometheus.sh): `promtool check rules` (syntax, PromQL,
# templates) and `promtool test rules` (test/prometheus/rules-test.yaml:
# the join gives dcgm-exporter's series their pods, each alert fires on
# what it watches and only then). The PrometheusRule the chart renders
# must carry exactly those rules.
set -euo pipefail
cd "$(dirname "$0")/.."
promtool=${PROMTOOL:-$(hack/build-prometheus.sh)/promtool}
rules=deploy/helm/hwdra/files/prometheus-rules.yaml
"$promtool" check rules "$rules"
"$promtool" test rules test/prometheus/rules-test.yaml
# The PrometheusRule's spec is the file, as promtool read it.
helm=${HELM:-$(hack/build-helm.sh)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$helm" template hwdra deploy/helm/hwdra -n hwdra-system --set monitoring.prometheusRule.enabled=true \
  --show-only templates/prometheusrule.yaml >"$tmp/rule.yaml"
awk '/^spec:$/ {s=1; next} s {sub(/^  /, ""); print}' "$tmp/rule.yaml" >"$tmp/spec.yaml"
"$promtool" check rules "$tmp/spec.yaml" >/dev/null
if ! diff <(grep -E '^\s*- (record|alert):' "$rules") <(grep -E '^\s*- (record|alert):' "$tmp/spec.yaml"); then
  echo "check-rules: the chart's PrometheusRule does not carry $rules"; exit 1
fi
echo "check-rules: $(grep -cE '^\s*- (record|alert):' "$rules") rules checked and tested"
