// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFleet measures what our ResourceSlices cost the real scheduler and
// API server across a fleet of simulated nodes (no kubelet; the scheduler
// only binds, as upstream scheduler_perf), against the same hardware as
// one device per GPU and per VF. Each run is a control plane of its own
// (framework.Options.ControlPlaneOnly) whose scheduler starts once every
// pod exists. Heavy: it runs only with HWDRA_FLEET=1 (hack/fleet.sh).
//
//	HWDRA_FLEET_NODES (10), HWDRA_FLEET_PODS (50), HWDRA_FLEET_BAD
//	(comma-separated badClaims keys; default all, "none" for none),
//	HWDRA_FLEET_TIMEOUT (10m, per run), HWDRA_FLEET_CLAIM_LIMITS (0: the
//	bad-claim runs without the chart's claim-limits policy),
//	HWDRA_FLEET_LEAN (1: also the leaner publications, plainModel and
//	leanModel), HWDRA_FLEET_NIC_FIRST (1: also nicFirstModel),
//	HWDRA_FLEET_SCHEDULER (comma-separated: upstream, patched; default
//	upstream), HWDRA_FLEET_PATCHED_SCHEDULER (the patched binary, which
//	hack/fleet.sh builds; HWDRA_FLEET_PATCHED_UNAVAILABLE: why there is
//	none), HWDRA_FLEET_SHARES (comma-separated numbers of shares allocated
//	before each run, fleet_shares_test.go; default 0),
//	HWDRA_FLEET_PERCENTAGE (the scheduler's percentageOfNodesToScore),
//	HWDRA_FLEET_PROFILE (a directory: the scheduler's CPU profiles per
//	kind, SCHEDULER-MODEL-KIND-N.pprof)
func TestFleet(t *testing.T) {
	if os.Getenv("HWDRA_FLEET") != "1" {
		t.Skip("fleet harness: set HWDRA_FLEET=1 (hack/fleet.sh)")
	}
	p := fleetParams{nodes: envInt(t, "HWDRA_FLEET_NODES", 10), pods: envInt(t, "HWDRA_FLEET_PODS", 50), timeout: 10 * time.Minute,
		// The bad-claim runs install the chart's claim-limits policy, as
		// an operator's cluster has it; HWDRA_FLEET_CLAIM_LIMITS=0
		// measures the scheduler without it.
		limits: os.Getenv("HWDRA_FLEET_CLAIM_LIMITS") != "0"}
	if v := os.Getenv("HWDRA_FLEET_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		p.timeout = d
	}
	if dir := os.Getenv("HWDRA_FLEET_PROFILE"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p.profile = dir
	}
	if os.Getenv("HWDRA_FLEET_PERCENTAGE") != "" {
		p.percentage = envInt(t, "HWDRA_FLEET_PERCENTAGE", 0)
	}
	bad := []string{"25x2g.20gb", "17x3g.40gb", "15xH100-1-10C"}
	if v := os.Getenv("HWDRA_FLEET_BAD"); v == "none" {
		bad = nil
	} else if v != "" {
		bad = strings.Split(v, ",")
	}
	for _, b := range bad {
		if _, ok := badClaims[b]; !ok {
			t.Fatalf("HWDRA_FLEET_BAD: no bad claim %q", b)
		}
	}
	invs := inventories{}
	t.Run("as-hwdra-slices", func(t *testing.T) { checkOursIsHwdraSlices(t, invs) })

	models := []fleetModel{oursModel, oneDeviceModel}
	if os.Getenv("HWDRA_FLEET_LEAN") == "1" {
		models = append(models, plainModel, leanModel)
	}
	if os.Getenv("HWDRA_FLEET_NIC_FIRST") == "1" {
		models = append(models, nicFirstModel)
	}
	var out []string
	report := func(lines ...string) { // as they come: a failed run keeps them
		for _, line := range lines {
			t.Log(line)
		}
		out = append(out, lines...)
	}
	for _, sched := range fleetSchedulers(t, report) {
		p.scheduler = sched
		var base fleetRun // ours without shares, which the bad claims' runs are compared with
		for _, shares := range envInts(t, "HWDRA_FLEET_SHARES", "0") {
			p.shares = shares
			runs := map[string]fleetRun{}
			for _, m := range models {
				t.Run(fmt.Sprintf("%s/shares=%d/%s", sched.name, shares, m.name), func(t *testing.T) { runs[m.name] = runFleet(t, m, p, invs) })
			}
			if runs[oursModel.name].kinds == nil || runs[oneDeviceModel.name].kinds == nil {
				t.Errorf("scheduler %s, %d shares: a run failed", sched.name, shares)
				continue
			}
			report(fleetLines(models, runs, p)...)
			if shares == 0 {
				base = runs[oursModel.name]
			}
		}
		p.shares = 0
		for _, b := range bad {
			t.Run(fmt.Sprintf("%s/bad-%s", sched.name, b), func(t *testing.T) {
				bp := p
				bp.bad = b
				report(badClaimLine(runFleet(t, oursModel, bp, invs), base, b, p))
			})
		}
	}
	fmt.Println(strings.Join(out, "\n"))
}

// fleetSchedulers are the schedulers HWDRA_FLEET_SCHEDULER names. A
// patched scheduler that could not be built is reported and left out.
func fleetSchedulers(t *testing.T, report func(...string)) []fleetScheduler {
	var out []fleetScheduler
	for _, name := range strings.Split(envOr("HWDRA_FLEET_SCHEDULER", "upstream"), ",") {
		switch name {
		case "upstream":
			out = append(out, fleetScheduler{name: name})
		case "patched":
			bin := os.Getenv("HWDRA_FLEET_PATCHED_SCHEDULER")
			if bin == "" {
				report("fleet scheduler=patched UNAVAILABLE: " + envOr("HWDRA_FLEET_PATCHED_UNAVAILABLE", "HWDRA_FLEET_PATCHED_SCHEDULER is not set (hack/fleet.sh builds it)"))
				continue
			}
			out = append(out, fleetScheduler{name: name, binary: bin})
		default:
			t.Fatalf("HWDRA_FLEET_SCHEDULER: %q is neither upstream nor patched", name)
		}
	}
	return out
}

// fleetLines are the figures of one scheduler and number of shares: per
// kind each model against the one-device model, then per model.
func fleetLines(models []fleetModel, runs map[string]fleetRun, p fleetParams) []string {
	var out []string
	one := runs[oneDeviceModel.name]
	where := fmt.Sprintf("scheduler=%s shares-in-use=%d", p.scheduler.name, p.shares)
	for _, m := range models {
		r, ok := runs[m.name]
		if m.name == oneDeviceModel.name || !ok || r.kinds == nil {
			continue
		}
		// "fleet KIND ... ours=": the default publication; another model
		// says its name: "fleet[lean] KIND ... lean=".
		prefix := "fleet"
		if m.name != oursModel.name {
			prefix += "[" + m.name + "]"
		}
		fill := ""
		if p.shares > 0 {
			fill = fmt.Sprintf(" %s: %s, one-device: %s;", m.name, r.fill, one.fill)
		}
		for _, k := range fleetKinds {
			o, d := r.kinds[k.name], one.kinds[k.name]
			left := ""
			if o.unbound+d.unbound > 0 {
				left = fmt.Sprintf(" LEFT PENDING: %s %d, one-device %d;", m.name, o.unbound, d.unbound)
			}
			out = append(out, fmt.Sprintf("%s %s nodes=%d pods=%d %s %s=%.1f pods/s one-device=%.1f pods/s cpu-ratio=%.2f p99=%.2fs (%s%s %s cpu/pod=%v one-device=%v p50=%.2fs, from scheduler start)",
				prefix, k.name, p.nodes, o.pods, where, m.name, o.rate, d.rate, ratio(o.cpuPerPod, d.cpuPerPod), o.p99.Seconds(),
				left, fill, m.name, o.cpuPerPod.Round(time.Microsecond), d.cpuPerPod.Round(time.Microsecond), o.p50.Seconds()))
		}
	}
	for _, m := range models {
		r, ok := runs[m.name]
		if !ok || r.pods == 0 {
			continue
		}
		f := float64(r.nodes)
		out = append(out,
			fmt.Sprintf("fleet all %s nodes=%d pods=%d %s %.1f pods/s scheduler-cpu/pod=%v",
				m.name, r.nodes, r.pods, where, float64(r.pods)/r.total.Seconds(), (r.cpu/time.Duration(r.pods)).Round(time.Microsecond)),
			fmt.Sprintf("fleet apiserver %s nodes=%d slices/node=%.1f bytes/node=%.0f watch-events/node=%.1f watch-bytes/node=%.0f",
				m.name, r.nodes, float64(r.slices)/f, float64(r.sliceBytes)/f, r.watchEvents/f, r.watchBytes/f))
	}
	return out
}

// badClaimLine says what a bad claim held up: r is the run with it, base
// the run without it (zero if HWDRA_FLEET_SHARES had no 0).
func badClaimLine(r, base fleetRun, b string, p fleetParams) string {
	held := "held=?"
	if base.total > 0 {
		held = fmt.Sprintf("held=%.1fs", (r.total - base.total).Seconds())
	}
	if r.badRefused != "" {
		return fmt.Sprintf("fleet bad-claim %s nodes=%d scheduler=%s %s attempts=0 (refused at creation by the chart's claim-limits policy: %s; all bound after %.1fs, %.1fs without it)",
			b, p.nodes, p.scheduler.name, held, r.badRefused, r.total.Seconds(), base.total.Seconds())
	}
	return fmt.Sprintf("fleet bad-claim %s nodes=%d scheduler=%s %s attempts=%.0f (FailedScheduling events %d; all bound after %.1fs, %.1fs without it; scheduler cpu %v vs %v)",
		b, p.nodes, p.scheduler.name, held, r.badAttempts, r.badEvents, r.total.Seconds(), base.total.Seconds(),
		r.cpu.Round(time.Millisecond), base.cpu.Round(time.Millisecond))
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// envInts is a comma-separated list of non-negative integers.
func envInts(t *testing.T, name, def string) []int {
	var out []int
	for _, f := range strings.Split(envOr(name, def), ",") {
		i, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || i < 0 {
			t.Fatalf("%s=%q: want non-negative integers, comma-separated", name, os.Getenv(name))
		}
		out = append(out, i)
	}
	return out
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	i, err := strconv.Atoi(v)
	if err != nil || i <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return i
}

// checkOursIsHwdraSlices: what the fleet's DGX, vGPU and NIC nodes get is
// what `hwdra slices` prints for them, object for object.
func checkOursIsHwdraSlices(t *testing.T, invs inventories) {
	for _, hardware := range []string{fleetHardware(0), fleetHardware(9), fleetHardware(19)} {
		node := "fleet-check"
		want := hwdraSlices(t, hardware, node)
		got := oursModel.slices(node, invs.get(t, hardware))
		if len(got) != len(want) {
			t.Fatalf("%s: %d slices, hwdra slices prints %d", hardware, len(got), len(want))
		}
		for i := range got {
			var mine map[string]any
			b, _ := json.Marshal(&got[i])
			if err := json.Unmarshal(b, &mine); err != nil {
				t.Fatal(err)
			}
			a, _ := json.Marshal(mine["spec"])
			w, _ := json.Marshal(want[i].Object["spec"])
			if got[i].Name != want[i].GetName() || string(a) != string(w) {
				t.Fatalf("%s: slice %d differs from hwdra slices':\n%s %s\n%s %s", hardware, i, got[i].Name, a, want[i].GetName(), w)
			}
		}
	}
}
