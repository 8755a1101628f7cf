#!/usr/bin/env bash
# The patch series in process, on this machine:
#
#   hack/upstream/bench.sh test          # the allocator's and its CEL package's own
#                                        # unit tests, patched
#   hack/upstream/bench.sh scheduler-test  # kube-scheduler's DynamicResources
#                                        # plugin's unit tests, patched
#   hack/upstream/bench.sh bench [ARGS]  # hwdra's fleet benchmarks against the
#                                        # patched allocator (ARGS go to go test;
#                                        # default: -bench 'Fleet' -benchtime=3x)
#   hack/upstream/bench.sh scheduler-perf [WORKLOADS]
#                                        # the series' scheduler_perf test case
#                                        # (PartitionableWithSharesInUse), released
#                                        # and patched, metrics side by side
#
# scheduler-perf runs BenchmarkPerfScheduling of scheduler_perf's
# dra/consumablecapacity package (the one that runs its performance-config
# workloads and writes their metrics: the test only checks that they run)
# for the workloads matching WORKLOADS (a regular expression, default
# shares_100nodes) once with the released sources plus only the series'
# scheduler_perf patches (tree.sh with HWDRA_UPSTREAM_PATCHES) and once
# with the whole series. It needs etcd on PATH, taken from
# hack/build-realnode.sh. HWDRA_SCHEDPERF_OUT (default: a new directory
# under /tmp) keeps each run's log and data items; HWDRA_SCHEDPERF_TIMEOUT
# (default 90m) bounds each run; HWDRA_SCHEDPERF_VARIANTS (default
# "released patched") picks which run; HWDRA_SCHEDPERF_METRICS (a regular
# expression) which metrics are printed.
#
# bench builds internal/agent/slices/resources with -tags
# hwdra_patched_allocator through a go.work that replaces
# k8s.io/dynamic-resource-allocation with the patched sources (tree.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
K8S_VERSION=${K8S_VERSION:-v1.37.2}
export K8S_VERSION
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}
tree=$(hack/upstream/tree.sh)
dra="$tree/staging/src/k8s.io/dynamic-resource-allocation"

perf_pkg=k8s.io/kubernetes/test/integration/scheduler_perf/dra/consumablecapacity
# The metrics printed side by side (a regular expression).
perf_metrics='^(SchedulingThroughput|SchedulingDuration|scheduler_scheduling_attempt_duration_seconds|scheduler_framework_extension_point_duration_seconds,extension_point=(PreFilter|Filter|Reserve)|heap_memory_usage)'

# perf_run VARIANT TREE WORKLOADS OUT: builds the scheduler_perf test binary
# from TREE and runs the workloads; its log and data items go under OUT.
perf_run() {
  local variant=$1 tree=$2 workloads=$3 out=$4 etcd_bin rc=0
  mkdir -p "$out/$variant"
  etcd_bin=$(hack/build-realnode.sh)
  # -trimpath: the two trees' packages that the series leaves alone then
  # share the build cache (without it the directory is part of its key).
  hack/upstream/module.sh "$work/$variant" "$tree" "$perf_pkg" >"$out/$variant.build.log" 2>&1 &&
    (cd "$work/$variant" && GOWORK=off go test -c -trimpath -vet=off -o "$work/$variant.test" "$perf_pkg") >>"$out/$variant.build.log" 2>&1 || {
    echo "scheduler-perf: $variant: the test binary did not build (see $out/$variant.build.log):" >&2
    tail -20 "$out/$variant.build.log" >&2
    return 1
  }
  {
    echo "# $variant: $(date -u +%FT%TZ) workloads ^($workloads)\$, tree $tree"
    echo "# uptime before: $(uptime)"
  } >"$out/$variant.run.log"
  local began=$SECONDS
  # The test apiserver finds its testdata from its source file's path,
  # which -trimpath leaves relative (k8s.io/kubernetes@VERSION/...); it
  # joins TEST_SRCDIR/TEST_WORKSPACE before it (set by bazel upstream).
  mkdir -p "$work/src/$variant/k8s.io"
  ln -sfn "$tree" "$work/src/$variant/k8s.io/kubernetes@$K8S_VERSION"
  # The test reads performance-config.yaml and its templates relative to
  # the package's directory. Its log goes to the file, not the terminal:
  # a benchmark's log is always printed, and is large.
  (cd "$tree/test/integration/scheduler_perf/dra/consumablecapacity" &&
    PATH="$etcd_bin:$PATH" TEST_SRCDIR="$work/src" TEST_WORKSPACE="$variant" \
    "$work/$variant.test" -test.run '^$' \
      -test.bench "^BenchmarkPerfScheduling\$/^PartitionableWithSharesInUse\$/^($workloads)\$" \
      -test.benchtime=1ns -test.timeout="${HWDRA_SCHEDPERF_TIMEOUT:-90m}" \
      -perf-scheduling-label-filter= -data-items-dir="$out/$variant") >>"$out/$variant.run.log" 2>&1 || rc=$?
  {
    echo "# uptime after: $(uptime)"
    echo "# exit $rc after $((SECONDS - began)) s"
  } >>"$out/$variant.run.log"
  if [ $rc -ne 0 ] || ! grep -q '^PASS$' "$out/$variant.run.log"; then
    echo "scheduler-perf: $variant: the run failed (exit $rc; see $out/$variant.run.log):" >&2
    grep -E '^(--- FAIL|FAIL|panic:)|Error running workload|timed out' "$out/$variant.run.log" | head -20 >&2
    return 1
  fi
  if [ -z "$(perf_items "$out/$variant")" ]; then
    echo "scheduler-perf: $variant: no metrics (no workload matches ^($workloads)\$?)" >&2
    return 1
  fi
}

# perf_items DIR: the data items of a run, one line per value:
# workload, metric with its labels, statistic, value, unit.
perf_items() {
  local f
  for f in "$1"/*.json; do
    [ -f "$f" ] || continue
    jq -r '(.dataItems // [])[] | select(.data != null) | .labels as $l | .unit as $u | .data | to_entries[] |
      [$l.Name, ([$l.Metric] + ($l | to_entries | map(select(.key != "Name" and .key != "Metric" and .value != "not applicable")) | map("\(.key)=\(.value)"))
        | join(",")), .key, (.value * 1000 | round / 1000 | tostring), $u] | @tsv' "$f"
  done
}

scheduler_perf() {
  local workloads=$1 out series_perf failed=0 v
  out=${HWDRA_SCHEDPERF_OUT:-$(mktemp -d /tmp/hwdra-schedperf.XXXXXX)}
  mkdir -p "$out"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # The released allocator, with the test case only.
  series_perf=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' hack/upstream/series | grep scheduler_perf | tr '\n' ' ')
  [ -n "$series_perf" ] || { echo "scheduler-perf: the series has no scheduler_perf patch" >&2; return 1; }
  for v in ${HWDRA_SCHEDPERF_VARIANTS:-released patched}; do
    case $v in
    released)
      local released
      if released=$(HWDRA_UPSTREAM_PATCHES="$series_perf" hack/upstream/tree.sh); then
        perf_run released "$released" "$workloads" "$out" || failed=1
      else
        echo "scheduler-perf: released: no tree (above)" >&2
        failed=1
      fi
      ;;
    patched) perf_run patched "$tree" "$workloads" "$out" || failed=1 ;;
    *) echo "scheduler-perf: unknown variant $v (released, patched)" >&2; return 2 ;;
    esac
  done
  echo "scheduler-perf: workloads ^($workloads)\$ in $out"
  grep -h '^# ' "$out"/*.run.log 2>/dev/null || true
  { perf_items "$out/released" | sed 's/^/released\t/' || true; } >"$out/items.tsv"
  { perf_items "$out/patched" | sed 's/^/patched\t/' || true; } >>"$out/items.tsv"
  # Side by side: one line per (workload, metric, statistic) whose metric
  # matches HWDRA_SCHEDPERF_METRICS (all of them are in items.tsv); "-"
  # where a run gave nothing.
  awk -F'\t' -v want="${HWDRA_SCHEDPERF_METRICS:-$perf_metrics}" '$3 ~ want {
      sub(/^BenchmarkPerfScheduling\//, "", $2); k = $2 "\t" $3 "\t" $4; if (!(k in seen)) { seen[k] = 1; order[n++] = k; unit[k] = $6 }
      val[$1, k] = $5 }
    END { printf "%-50s %-82s %-8s %9s %9s %s\n", "workload", "metric", "stat", "released", "patched", "unit"
      for (i = 0; i < n; i++) { k = order[i]; split(k, p, "\t")
        r = ((("released", k) in val) ? val["released", k] : "-"); q = ((("patched", k) in val) ? val["patched", k] : "-")
        printf "%-50s %-82s %-8s %9s %9s %s\n", p[1], p[2], p[3], r, q, unit[k] } }' "$out/items.tsv"
  return $failed
}

case "${1:-}" in
test)
  cd "$dra"
  export GOWORK=off
  exec go test -count=1 ./structured/... ./cel/...
  ;;
scheduler-test)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  plugin=k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources
  hack/upstream/module.sh "$work" "$tree" "$plugin"
  cd "$work"
  GOWORK=off go test -count=1 "$plugin"
  ;;
bench)
  shift
  [ $# -gt 0 ] || set -- -bench Fleet -benchtime=3x
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  version=$(go env GOVERSION)
  cat >"$work/go.work" <<WORK
go ${version#go}

use $repo

replace k8s.io/dynamic-resource-allocation => $dra
WORK
  GOWORK="$work/go.work" go test -tags hwdra_patched_allocator -run '^$' "$@" ./internal/agent/slices/resources/
  ;;
scheduler-perf)
  shift
  scheduler_perf "${1:-shares_100nodes}"
  ;;
*)
  echo "usage: hack/upstream/bench.sh test | scheduler-test | bench [go test args] | scheduler-perf [workload regexp]" >&2
  exit 2
  ;;
esac
