// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// EnvPrometheus is the directory with prometheus and promtool
// (hack/build-prometheus.sh; hack/e2e-realnode.sh sets it).
const EnvPrometheus = "HWDRA_PROMETHEUS_BIN"

// Prometheus is a real Prometheus in the node's network namespace,
// scraping every second and evaluating rules every second.
type Prometheus struct {
	API  promv1.API
	Addr string
	proc *Process
}

// ScrapeTarget is one of Prometheus's static scrape jobs.
type ScrapeTarget struct {
	Job, Address string
	// Labels are added to every series of the target (what the chart's
	// PodMonitor adds: node).
	Labels map[string]string
	// HonorLabels keeps the target's own labels where they clash with
	// the target's (the chart's PodMonitor sets it for the agent).
	HonorLabels bool
}

// ChartRules are the rule groups of the chart's PrometheusRule, as the
// chart renders it with monitoring.prometheusRule.enabled: what the
// Prometheus operator hands Prometheus.
func (n *Node) ChartRules(ctx context.Context) ([]byte, error) {
	out, err := n.RenderChart(ctx, map[string]any{"monitoring": map[string]any{"prometheusRule": map[string]any{"enabled": true}}})
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		var obj struct {
			Kind string         `json:"kind"`
			Spec map[string]any `json:"spec"`
		}
		if err := dec.Decode(&obj); err == io.EOF {
			return nil, fmt.Errorf("the chart renders no PrometheusRule")
		} else if err != nil {
			return nil, err
		}
		if obj.Kind == "PrometheusRule" {
			return yaml.Marshal(obj.Spec)
		}
	}
}

// StartPrometheus runs Prometheus (from $HWDRA_PROMETHEUS_BIN; the test
// skips without it) with these targets and rule groups until t ends.
func (n *Node) StartPrometheus(t testing.TB, targets []ScrapeTarget, rules []byte) *Prometheus {
	t.Helper()
	dir := os.Getenv(EnvPrometheus)
	if dir == "" {
		t.Skipf("%s is not set (hack/e2e-realnode.sh sets it to what hack/build-prometheus.sh prints)", EnvPrometheus)
	}
	root := filepath.Join(n.Root, "prometheus")
	if err := os.MkdirAll(filepath.Join(root, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	var jobs []map[string]any
	for _, tg := range targets {
		static := map[string]any{"targets": []string{tg.Address}}
		if len(tg.Labels) > 0 {
			static["labels"] = tg.Labels
		}
		jobs = append(jobs, map[string]any{"job_name": tg.Job, "honor_labels": tg.HonorLabels, "static_configs": []map[string]any{static}})
	}
	cfg := map[string]any{
		"global":         map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files":     []string{filepath.Join(root, "rules.yaml")},
		"scrape_configs": jobs,
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"prometheus.yaml": data, "rules.yaml": rules} {
		if err := os.WriteFile(filepath.Join(root, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &Prometheus{Addr: addr, proc: &Process{
		Name: "prometheus", Path: filepath.Join(dir, "prometheus"), LogPath: filepath.Join(n.Root, "logs", "prometheus.log"),
		Args: []string{"--config.file=" + filepath.Join(root, "prometheus.yaml"), "--storage.tsdb.path=" + filepath.Join(root, "data"),
			"--web.listen-address=" + addr, "--log.level=warn"},
	}}
	if err := p.proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus log:\n%s", p.proc.Tail(40))
		}
		p.proc.Stop(10 * time.Second)
	})
	client, err := promapi.NewClient(promapi.Config{Address: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	p.API = promv1.NewAPI(client)
	if err := waitfor.Check(context.Background(), "prometheus answering", 60*time.Second, func() error {
		_, err := p.API.Buildinfo(context.Background())
		if err != nil && !p.proc.Running() {
			t.Fatalf("prometheus exited: %v\n%s", err, p.proc.Tail(40))
		}
		return err
	}); err != nil {
		t.Fatalf("%v\n%s", err, p.proc.Tail(40))
	}
	return p
}

// Query evaluates an instant query now.
func (p *Prometheus) Query(ctx context.Context, query string) (model.Vector, error) {
	v, warnings, err := p.API.Query(ctx, query, time.Now())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", query, err)
	}
	if len(warnings) > 0 {
		return nil, fmt.Errorf("%s: warnings %v", query, warnings)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("%s: a %s, not a vector", query, v.Type())
	}
	return vec, nil
}

// WaitQuery polls a query until ok accepts its result, and returns that.
func (p *Prometheus) WaitQuery(ctx context.Context, query string, timeout time.Duration, ok func(model.Vector) bool) (model.Vector, error) {
	var v model.Vector
	err := waitfor.Check(ctx, query+": an accepted result", timeout, func() error {
		var err error
		if v, err = p.Query(ctx, query); err == nil && !ok(v) {
			err = fmt.Errorf("last %v", v)
		}
		return err
	})
	return v, err
}

// WaitAlert waits until Prometheus has alert name firing with labels
// (a subset), and returns it.
func (p *Prometheus) WaitAlert(ctx context.Context, name string, labels map[string]string, timeout time.Duration) (promv1.Alert, error) {
	var found promv1.Alert
	err := waitfor.Check(ctx, fmt.Sprintf("alert %s %v firing", name, labels), timeout, func() error {
		res, err := p.API.Alerts(ctx)
		if err != nil {
			return err
		}
		for _, a := range res.Alerts {
			if string(a.Labels[model.AlertNameLabel]) == name && a.State == promv1.AlertStateFiring && hasLabels(a.Labels, labels) {
				found = a
				return nil
			}
		}
		return fmt.Errorf("alerts: %+v", res.Alerts)
	})
	return found, err
}

func hasLabels(set model.LabelSet, want map[string]string) bool {
	for k, v := range want {
		if string(set[model.LabelName(k)]) != v {
			return false
		}
	}
	return true
}
