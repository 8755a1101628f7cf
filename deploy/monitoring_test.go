// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// dcgmFields are the dcgm-exporter series the dashboard and the rules may
// use: its default counters (etc/default-counters.csv) that they read,
// and DCGM_FI_PROF_GR_ENGINE_ACTIVE of etc/dcp-metrics-included.csv (the
// GPU operator's default), the one utilization DCGM gives per MIG
// instance. The real-node suite's stand-in serves these.
var dcgmFields = []string{
	"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
	"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
}

// agentMetrics reads the metric names of the operator guide's metrics
// table (which TestMetricsAsDocumented holds to a working agent's
// scrape), with their histograms' series.
func agentMetrics(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "docs", "operator-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `(hwdra_[a-z_]+)` \\| (counter|gauge|histogram) \\|")
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]] = true
			if m[2] == "histogram" {
				for _, s := range []string{"_bucket", "_count", "_sum"} {
					out[m[1]+s] = true
				}
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d metrics in the operator guide's table", len(out))
	}
	return out
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record      string            `json:"record"`
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chart, "files", "prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(data, &rf); err != nil {
		t.Fatalf("prometheus-rules.yaml: %v", err)
	}
	return rf
}

// The parts of a PromQL expression that name no series: strings (label
// values), matchers, ranges, grouping clauses, numbers; what is left and
// is followed by "(" is a function.
var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promName     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "e": true, "Inf": true, "NaN": true}
)

// seriesNames are the metric names a PromQL expression (or a Grafana
// label_values(expr, label) query) selects.
func seriesNames(expr string) []string {
	if inner, ok := strings.CutPrefix(strings.TrimSpace(expr), "label_values("); ok {
		expr = inner[:strings.LastIndex(inner, ",")]
	}
	expr = promString.ReplaceAllString(expr, `""`)
	expr = promMatchers.ReplaceAllString(expr, " ")
	expr = promRange.ReplaceAllString(expr, " ")
	expr = promGrouping.ReplaceAllString(expr, " ")
	var out []string
	for _, loc := range promName.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		if rest := strings.TrimLeft(expr[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") || promKeywords[name] {
			continue
		}
		if loc[0] > 0 && strings.ContainsAny(expr[loc[0]-1:loc[0]], "0123456789.") {
			continue // 1e3, 0.9
		}
		out = append(out, name)
	}
	return out
}

func TestSeriesNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.9, sum by (le, kind) (rate(hwdra_x_bucket{node=~"$node"}[5m])))`:      {"hwdra_x_bucket"},
		`a{b="c or d"} * on (Hostname, UUID) group_left (gpu) max by (UUID) (DCGM_FI_DEV_GPU_UTIL)`: {"a", "DCGM_FI_DEV_GPU_UTIL"},
		`sum(x) or vector(0)`:                          {"x"},
		`label_values(hwdra_agent_ready{a="b"}, node)`: {"hwdra_agent_ready"},
		`8 * rate(y[5m]) > 1e3 and z`:                  {"y", "z"},
	} {
		if got := seriesNames(expr); !slices.Equal(got, want) {
			t.Errorf("seriesNames(%s) = %v, want %v", expr, got, want)
		}
	}
}

type dashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	GridPos    map[string]int `json:"gridPos"`
	Targets    []struct {
		Expr       string         `json:"expr"`
		Datasource map[string]any `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chart, "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// TestDashboardQueries: every query of the dashboard (its panels' and its
// variables') selects only series that exist: the agent's (the operator
// guide's table), the rules' recordings, dcgm-exporter's; each panel
// reads the dashboard's Prometheus variable and has an ID of its own.
// The real-node suite runs every query against a real Prometheus.
func TestDashboardQueries(t *testing.T) {
	known := agentMetrics(t)
	known["up"] = true
	for _, f := range dcgmFields {
		known[f] = true
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	d := loadDashboard(t)
	check := func(where, expr string) {
		names := seriesNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q selects no series", where, expr)
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("%s: %s is no series of the agent, the rules or dcgm-exporter (%s)", where, n, expr)
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		check("variable "+v.Name, s)
	}
	ids := map[int]bool{}
	queries := 0
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel %q: ID %d taken", p.Title, p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource["uid"] != "${datasource}" {
				t.Errorf("panel %q reads datasource %v, not the dashboard's variable", p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				check("panel "+p.Title, tg.Expr)
				queries++
			}
		}
	}
	walk(d.Panels)
	if queries < 15 {
		t.Errorf("%d queries in the dashboard", queries)
	}
}

// TestRulesReadKnownSeries: the rules read only the agent's series,
// dcgm-exporter's, each other's and Prometheus's up.
func TestRulesReadKnownSeries(t *testing.T) {
	known := agentMetrics(t)
	known["up"] = true
	for _, f := range dcgmFields {
		known[f] = true
	}
	rf := loadRules(t)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			known[r.Record] = true
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			for _, n := range seriesNames(r.Expr) {
				if !known[n] {
					t.Errorf("rule %s%s reads %s, no series of the agent, the rules or dcgm-exporter", r.Record, r.Alert, n)
				}
			}
		}
	}
}
