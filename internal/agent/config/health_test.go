// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseHealth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		yaml    string
		want    HealthPolicy
		wantErr string
	}{{
		name: "no health section: defaults",
		yaml: header,
	}, {
		name: "XIDs moved both ways, NoExecute",
		yaml: header + "health:\n  xids: {ignore: [63, 64], report: [43]}\n  fatalEffect: NoExecute\n",
		want: HealthPolicy{IgnoreXIDs: []uint64{63, 64}, ReportXIDs: []uint64{43}, FatalNoExecute: true},
	}, {
		name: "NoSchedule spelled out",
		yaml: header + "health:\n  fatalEffect: NoSchedule\n",
	}, {
		name:    "an XID in both lists",
		yaml:    header + "health:\n  xids: {ignore: [13], report: [43, 13]}\n",
		wantErr: "health.xids.report[1]: Invalid value: 13: is also in health.xids.ignore",
	}, {
		name:    "unknown effect",
		yaml:    header + "health:\n  fatalEffect: Evict\n",
		wantErr: `health.fatalEffect: Unsupported value: "Evict": supported values: "NoSchedule", "NoExecute"`,
	}, {
		name:    "negative XID",
		yaml:    header + "health:\n  xids: {ignore: [-1]}\n",
		wantErr: "health.xids.ignore[0]: Invalid value: -1: must be a non-negative integer",
	}, {
		name:    "unknown field",
		yaml:    header + "health:\n  xid: {ignore: [1]}\n",
		wantErr: `unknown field "health.xid"`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseCase(t, tc.yaml, tc.wantErr)
			if c == nil {
				return
			}
			if got := c.HealthPolicy(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("policy %+v, want %+v", got, tc.want)
			}
		})
	}
	if p := Default().HealthPolicy(); !reflect.DeepEqual(p, HealthPolicy{}) {
		t.Fatalf("default policy %+v", p)
	}
}

// parseCase parses a test case's file: nil where an error containing
// wantErr was expected and came, the configuration where none was.
func parseCase(t *testing.T, yaml, wantErr string) *AgentConfig {
	t.Helper()
	c, err := Parse([]byte(yaml))
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %v, want one containing %q", err, wantErr)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}
