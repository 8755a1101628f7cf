// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"strings"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/agent/mps"
)

func TestParseGPUs(t *testing.T) {
	t.Parallel()
	all := []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb", "1g.23gb-me", "2g.45gb+me.all"}
	for _, tc := range []struct {
		name    string
		yaml    string
		offered []string
		wantErr string
	}{{
		name:    "no gpus section: every profile",
		yaml:    header,
		offered: all,
	}, {
		name:    "no media-engine variants",
		yaml:    header + "gpus:\n  migProfiles:\n    exclude: [\"*+me*\", \"*-me\"]\n",
		offered: []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb"},
	}, {
		name:    "one slice and the whole GPU, by name and pattern",
		yaml:    header + "gpus:\n  migProfiles:\n    include: [\"1g.*\", 7g.80gb]\n    exclude: [1g.20gb]\n",
		offered: []string{"1g.10gb", "1g.10gb+me", "7g.80gb", "1g.23gb-me"},
	}, {
		name:    "upper case",
		yaml:    header + "gpus:\n  migProfiles:\n    include: [1G.10GB]\n",
		wantErr: `gpus.migProfiles.include[0]: Invalid value: "1G.10GB": must be a MIG profile name`,
	}, {
		name:    "bracket pattern",
		yaml:    header + "gpus:\n  migProfiles:\n    exclude: [\"[12]g.*\"]\n",
		wantErr: `gpus.migProfiles.exclude[0]: Invalid value: "[12]g.*"`,
	}, {
		name:    "empty name",
		yaml:    header + "gpus:\n  migProfiles:\n    exclude: [\"\"]\n",
		wantErr: `gpus.migProfiles.exclude[0]: Invalid value: ""`,
	}, {
		name:    "unknown field",
		yaml:    header + "gpus:\n  migProfile: {}\n",
		wantErr: `unknown field "gpus.migProfile"`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseCase(t, tc.yaml, tc.wantErr)
			if c == nil {
				return
			}
			var got []string
			for _, p := range all {
				if c.GPUPolicy().OffersMIGProfile(p) {
					got = append(got, p)
				}
			}
			if strings.Join(got, " ") != strings.Join(tc.offered, " ") {
				t.Errorf("offered %v, want %v", got, tc.offered)
			}
		})
	}
	for _, p := range all {
		if !Default().GPUPolicy().OffersMIGProfile(p) {
			t.Errorf("the default leaves out %s", p)
		}
	}
}

// TestParseGPUSettings: gpus.settings defaults to Manage (no file, no gpus
// section, a gpus section without it), takes Leave, and refuses any other
// value, case included, naming the field and the values it takes.
func TestParseGPUSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		want       GPUSettings
		wantErr    string
	}{
		{name: "no gpus section", yaml: header, want: SettingsManage},
		{name: "gpus without settings", yaml: header + "gpus:\n  migProfiles: {exclude: [\"*+me*\"]}\n", want: SettingsManage},
		{name: "Manage", yaml: header + "gpus: {settings: Manage}\n", want: SettingsManage},
		{name: "Leave", yaml: header + "gpus: {settings: Leave}\n", want: SettingsLeave},
		{name: "lower case", yaml: header + "gpus: {settings: leave}\n",
			wantErr: `gpus.settings: Unsupported value: "leave": supported values: "Manage", "Leave"`},
		{name: "another word", yaml: header + "gpus: {settings: Keep}\n",
			wantErr: `gpus.settings: Unsupported value: "Keep": supported values: "Manage", "Leave"`},
		{name: "empty", yaml: header + "gpus: {settings: \"\"}\n", want: SettingsManage},
		{name: "not a string", yaml: header + "gpus: {settings: [Leave]}\n", wantErr: "gpus.settings"},
		{name: "a typo in the field", yaml: header + "gpus: {setting: Leave}\n", wantErr: `unknown field "gpus.setting"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseCase(t, tc.yaml, tc.wantErr)
			if c == nil {
				return
			}
			p := c.GPUPolicy()
			if p.Settings() != tc.want || p.ManagesSettings() != (tc.want == SettingsManage) {
				t.Errorf("settings %s (manages %v), want %s", p.Settings(), p.ManagesSettings(), tc.want)
			}
		})
	}
	if p := Default().GPUPolicy(); p.Settings() != SettingsManage || !p.ManagesSettings() {
		t.Errorf("without a file: %s", p.Settings())
	}
	if p := (GPUPolicy{}); p.Settings() != SettingsManage {
		t.Errorf("the zero policy: %s", p.Settings())
	}
}

// TestParseGPUShares: gpus.shares defaults to stopping overuse, checked
// every second; Report and an interval are taken; a bad value is refused
// naming the field.
func TestParseGPUShares(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		stop       bool
		interval   time.Duration
		wantErr    string
	}{
		{name: "no gpus section", yaml: header, stop: true, interval: time.Second},
		{name: "empty shares", yaml: header + "gpus: {shares: {}}\n", stop: true, interval: time.Second},
		{name: "Report", yaml: header + "gpus: {shares: {overuse: Report}}\n", stop: false, interval: time.Second},
		{name: "Stop, 250 ms", yaml: header + "gpus: {shares: {overuse: Stop, checkIntervalMilliseconds: 250}}\n", stop: true, interval: 250 * time.Millisecond},
		{name: "another word", yaml: header + "gpus: {shares: {overuse: Kill}}\n",
			wantErr: `gpus.shares.overuse: Unsupported value: "Kill": supported values: "Stop", "Report"`},
		{name: "too often", yaml: header + "gpus: {shares: {checkIntervalMilliseconds: 10}}\n",
			wantErr: `gpus.shares.checkIntervalMilliseconds: Invalid value: 10: must be 100 to 60000`},
		{name: "a typo", yaml: header + "gpus: {shares: {overUse: Report}}\n", wantErr: `unknown field "gpus.shares.overUse"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseCase(t, tc.yaml, tc.wantErr)
			if c == nil {
				return
			}
			p := c.GPUPolicy()
			if p.StopsShareOveruse() != tc.stop || p.ShareCheckInterval() != tc.interval {
				t.Errorf("stop %v every %s, want %v every %s", p.StopsShareOveruse(), p.ShareCheckInterval(), tc.stop, tc.interval)
			}
		})
	}
}

// TestParseGPUMPS: gpus.mps defaults to a 1Gi shared memory and a 4Gi
// daemon cgroup, the mps package's defaults too; sizes are taken; a bad
// or out-of-range one is refused naming the field.
func TestParseGPUMPS(t *testing.T) {
	t.Parallel()
	if d := (GPUPolicy{}); d.MPSShmSize() != mps.DefaultShmSize || d.MPSDaemonMemoryLimit() != mps.DefaultMemoryLimit {
		t.Errorf("the defaults %d, %d differ from the MPS manager's %d, %d", d.MPSShmSize(), d.MPSDaemonMemoryLimit(), mps.DefaultShmSize, mps.DefaultMemoryLimit)
	}
	for _, tc := range []struct {
		name, yaml  string
		shm, memory int64
		wantErr     string
	}{
		{name: "no gpus section", yaml: header, shm: 1 << 30, memory: 4 << 30},
		{name: "empty mps", yaml: header + "gpus: {mps: {}}\n", shm: 1 << 30, memory: 4 << 30},
		{name: "sizes", yaml: header + "gpus: {mps: {shmSize: 256Mi, daemonMemoryLimit: 8Gi}}\n", shm: 256 << 20, memory: 8 << 30},
		{name: "not a size", yaml: header + "gpus: {mps: {shmSize: lots}}\n",
			wantErr: `gpus.mps.shmSize: Invalid value: "lots": must be a quantity of bytes, like "1Gi"`},
		{name: "too small a shm", yaml: header + "gpus: {mps: {shmSize: 4Ki}}\n",
			wantErr: `gpus.mps.shmSize: Invalid value: "4Ki": must be at least 1Mi`},
		{name: "too small a limit", yaml: header + "gpus: {mps: {daemonMemoryLimit: 10Mi}}\n",
			wantErr: `gpus.mps.daemonMemoryLimit: Invalid value: "10Mi": must be at least 64Mi`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseCase(t, tc.yaml, tc.wantErr)
			if c == nil {
				return
			}
			p := c.GPUPolicy()
			if p.MPSShmSize() != tc.shm || p.MPSDaemonMemoryLimit() != tc.memory {
				t.Errorf("shm %d, memory %d; want %d, %d", p.MPSShmSize(), p.MPSDaemonMemoryLimit(), tc.shm, tc.memory)
			}
		})
	}
}
