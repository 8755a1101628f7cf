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
//	leanModel)
func TestFleet(t *testing.T) {
	if os.Getenv("HWDRA_FLEET") != "1" {
		t.Skip("fleet harness: set HWDRA_FLEET=1 (hack/fleet.sh)")
	}
	nodes, pods := envInt(t, "HWDRA_FLEET_NODES", 10), envInt(t, "HWDRA_FLEET_PODS", 50)
	timeout := 10 * time.Minute
	if v := os.Getenv("HWDRA_FLEET_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		timeout = d
	}
	bad := []string{"25x2g.20gb", "17x3g.40gb", "15xH100-1-10C"}
	// The bad-claim runs install the chart's claim-limits policy, as an
	// operator's cluster has it; HWDRA_FLEET_CLAIM_LIMITS=0 measures the
	// scheduler without it.
	limits := os.Getenv("HWDRA_FLEET_CLAIM_LIMITS") != "0"
	if v := os.Getenv("HWDRA_FLEET_BAD"); v == "none" {
		bad = nil
	} else if v != "" {
		bad = strings.Split(v, ",")
	}
	invs := inventories{}
	t.Run("as-hwdra-slices", func(t *testing.T) { checkOursIsHwdraSlices(t, invs) })

	models := []fleetModel{oursModel, oneDeviceModel}
	if os.Getenv("HWDRA_FLEET_LEAN") == "1" {
		models = append(models, plainModel, leanModel)
	}
	runs := map[string]fleetRun{}
	for _, m := range models {
		t.Run(m.name, func(t *testing.T) { runs[m.name] = runFleet(t, m, nodes, pods, "", false, invs, timeout) })
	}
	ours, one := runs[oursModel.name], runs[oneDeviceModel.name]
	if ours.kinds == nil || one.kinds == nil {
		t.Fatal("a run failed")
	}
	var out []string
	for _, m := range models {
		if m.name == oneDeviceModel.name {
			continue
		}
		// "fleet KIND ... ours=": the default publication; another model
		// says its name: "fleet[lean] KIND ... lean=".
		prefix := "fleet"
		if m.name != oursModel.name {
			prefix += "[" + m.name + "]"
		}
		for _, k := range fleetKinds {
			o, d := runs[m.name].kinds[k.name], one.kinds[k.name]
			left := ""
			if o.unbound+d.unbound > 0 {
				left = fmt.Sprintf(" LEFT PENDING: %s %d, one-device %d;", m.name, o.unbound, d.unbound)
			}
			out = append(out, fmt.Sprintf("%s %s nodes=%d pods=%d %s=%.1f pods/s one-device=%.1f pods/s cpu-ratio=%.2f p99=%.2fs (%s%s cpu/pod=%v one-device=%v p50=%.2fs, from scheduler start)",
				prefix, k.name, nodes, o.pods, m.name, o.rate, d.rate, ratio(o.cpuPerPod, d.cpuPerPod), o.p99.Seconds(),
				left, m.name, o.cpuPerPod.Round(time.Microsecond), d.cpuPerPod.Round(time.Microsecond), o.p50.Seconds()))
		}
	}
	for _, m := range models {
		r := runs[m.name]
		f := float64(r.nodes)
		out = append(out,
			fmt.Sprintf("fleet all %s nodes=%d pods=%d %.1f pods/s scheduler-cpu/pod=%v",
				m.name, r.nodes, r.pods, float64(r.pods)/r.total.Seconds(), (r.cpu/time.Duration(r.pods)).Round(time.Microsecond)),
			fmt.Sprintf("fleet apiserver %s nodes=%d slices/node=%.1f bytes/node=%.0f watch-events/node=%.1f watch-bytes/node=%.0f",
				m.name, r.nodes, float64(r.slices)/f, float64(r.sliceBytes)/f, r.watchEvents/f, r.watchBytes/f))
	}
	for _, line := range out { // as they come: a failed bad-claim run keeps them
		t.Log(line)
	}
	for _, b := range bad {
		if _, ok := badClaims[b]; !ok {
			t.Fatalf("HWDRA_FLEET_BAD: no bad claim %q", b)
		}
		t.Run("bad-"+b, func(t *testing.T) {
			r := runFleet(t, oursModel, nodes, pods, b, limits, invs, timeout)
			if r.badRefused != "" {
				// held: the run against the one without a bad claim (noise
				// only: the claim never existed).
				line := fmt.Sprintf("fleet bad-claim %s nodes=%d held=%.1fs attempts=0 (refused at creation by the chart's claim-limits policy: %s; all bound after %.1fs, %.1fs without it)",
					b, nodes, (r.total - ours.total).Seconds(), r.badRefused, r.total.Seconds(), ours.total.Seconds())
				out = append(out, line)
				t.Log(line)
				return
			}
			line := fmt.Sprintf("fleet bad-claim %s nodes=%d held=%.1fs attempts=%.0f (FailedScheduling events %d; all bound after %.1fs, %.1fs without it; scheduler cpu %v vs %v)",
				b, nodes, (r.total - ours.total).Seconds(), r.badAttempts, r.badEvents, r.total.Seconds(), ours.total.Seconds(),
				r.cpu.Round(time.Millisecond), ours.cpu.Round(time.Millisecond))
			out = append(out, line)
			t.Log(line)
		})
	}
	fmt.Println(strings.Join(out, "\n"))
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
