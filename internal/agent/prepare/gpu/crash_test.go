// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/state"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// crash is what the test hook panics with: the agent dies right after a
// side effect, before it records the effect's result.
type crash struct{ after string }

// crashed runs a prepare whose agent dies (the hook panics with crash)
// and reports after which side effect it died.
func crashed(run func()) (died string) {
	defer func() {
		r := recover()
		if cr, ok := r.(crash); ok {
			died = cr.after
			return
		}
		if r != nil {
			panic(r)
		}
	}()
	run()
	return ""
}

func TestFailureAfterEachSideEffect(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		req           request
		effects       []string
		setup         func(e *env)
	}{
		{"dynamic MIG", "gpus: [{model: h100-80gb, count: 1}]",
			request{name: "mig", cel: `profile == "1g.10gb"`}, []string{"mig-mode", "gpu-instance", "compute-instance"}, nil},
		{"dynamic MIG next to a static partition", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb, start: 0}]}]",
			request{name: "mig", cel: `profile == "3g.40gb" && device.attributes["gpu.hwdra.io"].placementStart == 4`}, []string{"gpu-instance", "compute-instance"}, nil},
		{"vGPU", "h100-vgpu", request{name: "vgpu", cel: `profile == "H100-20C"`}, []string{"mdev"}, nil},
		{"MIG-backed vGPU", "h100-vgpu", request{name: "vgpu", cel: `profile == "H100-1-10C"`}, []string{"mig-mode", "gpu-instance", "mdev"}, nil},
		{"vGPU of the VFIO framework", vfioHost, request{name: "vgpu", cel: `profile == "H100-20C"`}, []string{"vf-vgpu"}, nil},
		{"MIG-backed vGPU of the VFIO framework", vfioHost, request{name: "vgpu", cel: `profile == "H100-1-10C"`}, []string{"mig-mode", "gpu-instance", "vf-vgpu"}, nil},
		// An administrator's GPU instance with a compute instance of one
		// slice (at slice 2): the claim wants two slices, gets a compute
		// instance of its own next to it, and never touches the other.
		{"compute instance in a static partition", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb, start: 0}]}]",
			request{name: "mig", cel: `profile == "3g.40gb" && device.attributes["gpu.hwdra.io"].placementStart == 0`,
				config: `{"apiVersion": "gpu.hwdra.io/v1alpha1", "kind": "GpuConfig", "mig": {"computeInstanceSlices": 2}}`},
			[]string{"compute-instance"}, func(e *env) {
				dev, _ := e.hw.NVML.DeviceGetHandleByIndex(0)
				gi, _ := dev.GetGpuInstanceById(0)
				cis, _ := gi.GetComputeInstances(&gonvml.ComputeInstanceProfileInfo{Id: gonvml.COMPUTE_INSTANCE_PROFILE_3_SLICE})
				cis[0].Destroy()
				one, _ := gi.GetComputeInstanceProfileInfo(gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if _, ret := gi.CreateComputeInstanceWithPlacement(&one, &gonvml.ComputeInstancePlacement{Start: 2, Size: 1}); ret != gonvml.SUCCESS {
					e.t.Fatal(ret)
				}
				e.rescan()
			}},
		// An administrator made the GPU exclusive: time slicing makes it
		// shareable for the claim, and the mode comes back.
		{"time slicing", "gpus: [{model: h100-80gb, count: 1}]",
			request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}`)},
			[]string{"compute-mode", "time-slice"}, func(e *env) {
				if err := e.nvml.SetComputeMode("0000:1b:00.0", nvml.ComputeExclusiveProcess); err != nil {
					e.t.Fatal(err)
				}
			}},
		{"MPS", "gpus: [{model: h100-80gb, count: 1}]",
			request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}`)},
			[]string{"compute-mode", "mps"}, nil},
		{"GPU share", "gpus: [{model: h100-80gb, count: 1}]", shareOf("s", "10Gi", "40"), []string{"compute-mode", "mps"}, nil},
		// An administrator made the GPU exclusive: a dedicated share
		// makes it Default for its daemon, and the mode comes back.
		{"dedicated GPU share", "gpus: [{model: h100-80gb, count: 1}]", dedicatedShareOf("s", "10Gi", "40"), []string{"compute-mode", "mps"}, func(e *env) {
			if err := e.nvml.SetComputeMode("0000:1b:00.0", nvml.ComputeExclusiveProcess); err != nil {
				e.t.Fatal(err)
			}
		}},
		{"MPS on a dynamic MIG partition", "gpus: [{model: h100-80gb, count: 1}]",
			request{name: "mig", cel: `profile == "1g.10gb"`, config: sharingConfig(`{"strategy": "MPS"}`)},
			[]string{"mig-mode", "gpu-instance", "compute-instance", "mps"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, false)
			if tc.setup != nil {
				tc.setup(e)
			}
			before := e.hwState()
			c := e.claim(tc.req)
			var seen []string
			e.restart(func(what string) error { seen = append(seen, what); return nil })
			e.mustPrepare(c)
			e.unprepare(c)
			if !slices.Equal(seen, tc.effects) {
				t.Fatalf("side effects %v, want %v: the test must fail after each", seen, tc.effects)
			}
			clean := func(when string) {
				t.Helper()
				e.wantAsBefore(t, before, when)
				if specs, _ := filepath.Glob(filepath.Join(e.dir, "cdi", "*")); len(specs) != 0 {
					t.Errorf("%s: CDI specs %v", when, specs)
				}
			}
			for i, at := range tc.effects {
				t.Run("error after "+at, func(t *testing.T) {
					n := 0
					e.restart(func(what string) error {
						if n++; n == i+1 {
							return fmt.Errorf("injected failure after %s", what)
						}
						return nil
					})
					if _, err := e.prepare(c); err == nil || !strings.Contains(err.Error(), "injected failure after "+at) || !strings.Contains(err.Error(), c.Name) {
						t.Fatalf("prepare: %v", err)
					}
					clean("after the failed prepare")
					e.restart(nil)
					e.mustPrepare(c)
					e.unprepare(c)
					clean("after preparing again")
				})
				t.Run("crash after "+at, func(t *testing.T) {
					n := 0
					e.restart(func(what string) error {
						if n++; n == i+1 {
							panic(crash{what})
						}
						return nil
					})
					if died := crashed(func() { e.prepare(c) }); died != at {
						t.Fatalf("died after %q, want %q", died, at)
					}
					if e.hwState() == before {
						t.Fatal("the side effect did not happen")
					}
					// Killed between making and recording: the ledger lists
					// what the agent made, except a compute instance in a
					// static GPU instance, whose intent is in the claim's
					// record (the only checkpoint write before the end).
					rec, inCheckpoint := e.checkpointRecord(c.UID)
					ledger := strings.Join(e.ledgerKeys(), " ")
					staticCI := at == "compute-instance" && !strings.Contains(ledger, "gi/")
					if inCheckpoint != staticCI {
						t.Errorf("claim in the checkpoint: %v, want %v (record %+v)", inCheckpoint, staticCI, rec)
					}
					switch at {
					case "gpu-instance":
						if !strings.Contains(ledger, "gi/") {
							t.Errorf("no ledger entry of the GPU instance: %v", ledger)
						}
					case "compute-instance":
						if staticCI && (len(rec.Devices) != 1 || rec.Devices[0].ComputeInstance == nil ||
							rec.Devices[0].ComputeInstance.ID != nil || len(rec.Devices[0].ComputeInstance.Existing) != 1) {
							t.Errorf("compute instance record %+v, want the intent only", rec)
						}
					case "mdev":
						if mdevs := e.hw.MdevUUIDs(); len(mdevs) != 1 || !strings.Contains(ledger, "mdev/"+mdevs[0]) {
							t.Errorf("ledger %v, mdevs %v", ledger, mdevs)
						}
					case "vf-vgpu":
						if vfs := e.hw.VGPUVFs(); len(vfs) != 1 || !strings.Contains(ledger, "vf/"+strings.Split(vfs[0], "=")[0]) {
							t.Errorf("ledger %v, vGPU VFs %v", ledger, vfs)
						}
					case "mig-mode":
						if !strings.Contains(ledger, "migmode/") {
							t.Errorf("no ledger entry of the MIG mode switch: %v", ledger)
						}
					}
					e.restart(nil) // a fresh agent on the same state and hardware
					clean("after the restart")
					if _, ok := e.checkpointRecord(c.UID); ok {
						t.Error("the crashed claim is still in the checkpoint")
					}
					e.mustPrepare(c)
					e.unprepare(c)
					clean("after preparing again")
				})
			}
		})
	}
}

// TestLostStateNeverLeaksNorBreaksRunningClaims: between prepare and
// unprepare the agent's state is lost in every way, and the agent restarts:
// the running claims' hardware is left as it is, each claim's unprepare
// then removes exactly what was made for it (and its CDI spec), new claims
// prepare, and nothing leaks. With the CDI specs gone too, what the ledger
// says the agent made is kept while the API server says the claims are
// allocated, and removed once they are not. (With the ledger gone as well,
// nothing tells the agent's instances from an administrator's: they stay,
// as static partitions do.)
func TestLostStateNeverLeaksNorBreaksRunningClaims(t *testing.T) {
	scenarios := []struct {
		name, profile string
		reqs          []request
	}{
		{"MIG", "h100-mig", []request{
			{name: "dynamic", cel: `profile == "1g.10gb"`},
			{name: "static", cel: `profile == "3g.40gb" && device.attributes["gpu.hwdra.io"].placementStart == 0`},
		}},
		{"MIG mode switched", "gpus: [{model: h100-80gb, count: 1}]", []request{{name: "mig", cel: `profile == "2g.20gb"`}}},
		{"vGPU", "h100-vgpu", []request{{name: "a", cel: `profile == "H100-2-20C"`}, {name: "b", cel: `profile == "H100-10C"`}}},
		{"vGPU of the VFIO framework", "h100-vm", []request{{name: "a", cel: `profile == "H100-2-20C"`}, {name: "b", cel: `profile == "H100-10C"`}}},
	}
	losses := []struct {
		name string
		lose func(t *testing.T, e *env)
		// specsLost: the claims' CDI specs are gone too
		specsLost bool
	}{
		{"every state file corrupt", func(t *testing.T, e *env) {
			files, _ := filepath.Glob(filepath.Join(e.dir, "state", "*"))
			for _, f := range files {
				if err := os.WriteFile(f, []byte("{garbage"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}, false},
		{"state directory deleted", func(t *testing.T, e *env) { os.RemoveAll(filepath.Join(e.dir, "state")) }, false},
		{"downgrade", func(t *testing.T, e *env) {
			for _, kind := range []string{"checkpoint", "ledger"} {
				newer := fmt.Sprintf(`{"version":"hwdra.io/%s/v7","checksum":"x","data":{},"entries":{}}`, kind)
				if err := state.Replace(filepath.Join(e.dir, "state", DriverName+"."+kind+".json"), []byte(newer)); err != nil {
					t.Fatal(err)
				}
			}
		}, false},
		{"checkpoint and CDI specs lost, ledger kept", func(t *testing.T, e *env) {
			os.Remove(filepath.Join(e.dir, "state", DriverName+".checkpoint.json"))
			os.Remove(filepath.Join(e.dir, "state", DriverName+".checkpoint.json.1"))
			specs, _ := filepath.Glob(filepath.Join(e.dir, "cdi", DriverName+"_claim_*"))
			for _, s := range specs {
				os.Remove(s)
			}
		}, true},
	}
	for _, sc := range scenarios {
		for _, loss := range losses {
			t.Run(sc.name+"/"+loss.name, func(t *testing.T) {
				e := newEnv(t, sc.profile, false)
				var allocated []*resourceapi.ResourceClaim
				var mu sync.Mutex
				var asked atomic.Int32 // each reclaim asks once, first
				e.allocated = func(context.Context) ([]*resourceapi.ResourceClaim, error) {
					asked.Add(1)
					mu.Lock()
					defer mu.Unlock()
					return slices.Clone(allocated), nil
				}
				e.restart(nil)
				before := e.hwState()
				var claims []*resourceapi.ResourceClaim
				for _, r := range sc.reqs {
					c := e.claim(r)
					e.mustPrepare(c)
					claims = append(claims, c)
				}
				mu.Lock()
				allocated = slices.Clone(claims)
				mu.Unlock()
				running := e.hwState()
				if running == before || len(e.ledgerKeys()) == 0 {
					t.Fatalf("nothing made: %s, ledger %v", running, e.ledgerKeys())
				}
				loss.lose(t, e)
				asks := asked.Load()
				e.restart(nil) // the first reclaim, done when it returns
				if loss.specsLost {
					// Nothing records the claims, so the first reclaim keeps
					// their hardware and reclaims go on in the background
					// while they are allocated: the third ask comes after
					// the first of them ended (or the hardware changed: no
					// need to wait).
					waitfor.True(t, "reclaims going on in the background", 10*time.Second, func() bool { return asked.Load() >= asks+3 || e.hwState() != running })
				}
				if got := e.hwState(); got != running {
					t.Fatalf("the running claims' hardware changed at the restart:\n%s\nwant\n%s", got, running)
				}
				if loss.specsLost {
					// Nothing records the claims: the kubelet's unprepare
					// finds nothing to do, and what they used goes once
					// the API server no longer lists them.
					for _, c := range claims {
						e.unprepare(c)
					}
					if got := e.hwState(); got != running {
						t.Fatalf("removed while the claims are allocated:\n%s", got)
					}
					mu.Lock()
					allocated = nil
					mu.Unlock()
					waitfor.True(t, "the deallocated claims' hardware reclaimed", 10*time.Second, func() bool { return e.hwState() == before && len(e.ledgerKeys()) == 0 })
				} else {
					for _, c := range claims {
						e.unprepare(c)
					}
				}
				e.wantAsBefore(t, before, "after unprepare")
				if specs, _ := filepath.Glob(filepath.Join(e.dir, "cdi", DriverName+"_claim_*")); len(specs) != 0 {
					t.Errorf("CDI specs left: %v", specs)
				}
				for _, c := range claims {
					e.alloc.Release(c)
				}
				c := e.claim(sc.reqs[0])
				e.mustPrepare(c)
				e.unprepare(c)
			})
		}
	}
}
