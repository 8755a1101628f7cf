// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// Under gpus.settings Leave the agent changes no GPU setting: no MIG
// mode, compute mode or time slice call reaches the mock GPU (counted, so
// that a change undone within a prepare and unprepare is caught too).
// The env's allocator publishes as under Manage: a claim may have been
// allocated before the setting changed.

// settingCalls are the MIG mode, compute mode and time slice calls that
// reached the mock GPUs so far, by GPU then call.
func (e *env) settingCalls() map[string]map[string]int {
	return persist.SettingCalls(e.hw.Calls())
}

// settingCallsSince are the setting calls made since settingCalls said
// earlier, by GPU then call.
func (e *env) settingCallsSince(earlier map[string]map[string]int) map[string]map[string]int {
	out := map[string]map[string]int{}
	for g, byCall := range e.settingCalls() {
		for call, n := range byCall {
			if n -= earlier[g][call]; n > 0 {
				if out[g] == nil {
					out[g] = map[string]int{}
				}
				out[g][call] = n
			}
		}
	}
	return out
}

// wantNoSettingCall fails where a setting call reached a GPU.
func (e *env) wantNoSettingCall(t *testing.T, when string) {
	t.Helper()
	if calls := e.settingCalls(); len(calls) != 0 {
		t.Errorf("%s: setting calls reached the GPUs: %v", when, calls)
	}
}

// deviceOf is the device allocated to a claim's request.
func deviceOf(t *testing.T, c *resourceapi.ResourceClaim, request string) string {
	t.Helper()
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Request == request {
			return r.Device
		}
	}
	t.Fatalf("claim %s: no device for request %q", c.Name, request)
	return ""
}

// wantRefused checks that err names every one of want, the claim first.
func wantRefused(t *testing.T, err error, c *resourceapi.ResourceClaim, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("prepare succeeded")
	}
	for _, w := range append([]string{"claim default/" + c.Name}, want...) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

// A whole GPU under Leave: prepared and unprepared without a setting
// call.
func TestLeaveWholeGPU(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	e.restartWith(config.SettingsLeave)
	before := e.hwState()
	c := e.claim(request{name: "gpu", cel: `profile == "full"`})
	e.mustPrepare(c)
	e.wantNoSettingCall(t, "after prepare")
	e.unprepare(c)
	e.wantAsBefore(t, before, "after unprepare")
	e.wantNoSettingCall(t, "after unprepare")
}

// A MIG partition of a GPU already in MIG mode under Leave: its instance
// is made and destroyed (dynamic MIG), and the MIG mode is never set.
func TestLeaveMIGOnAMIGGPU(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1, mig: true}]", true)
	e.restartWith(config.SettingsLeave)
	before := e.hwState()
	c := e.claim(request{name: "mig", cel: `profile == "1g.10gb"`})
	devs := e.mustPrepare(c)
	if uuid := attr(devs[0], "uuid"); !strings.HasPrefix(uuid, "MIG-") {
		t.Errorf("the container's device %s is no MIG device", uuid)
	}
	calls := e.hw.Calls()[e.gpus[0].PCIBusID]
	if calls[persist.CallCreateGpuInstance] != 1 || calls[persist.CallCreateComputeInstance] != 1 {
		t.Errorf("calls %v: want a GPU instance and a compute instance made", calls)
	}
	e.wantNoSettingCall(t, "after prepare")
	e.unprepare(c)
	e.wantAsBefore(t, before, "after unprepare")
	e.wantNoSettingCall(t, "after unprepare")
}

// A MIG partition of a GPU with MIG off, allocated before the setting
// changed, is refused under Leave naming the claim, the device and the
// setting, before anything is applied: the claim's partition of the GPU
// in MIG mode, which comes first, is not made either (no instance made
// and destroyed again), no call at all reaches the hardware, and nothing
// is recorded.
func TestLeaveRefusesMIGOnAMIGOffGPU(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1, mig: true}, {model: h100-80gb, count: 1}]", true)
	e.restartWith(config.SettingsLeave)
	before := e.hwState()
	on, off := e.gpus[0].PCIBusID, e.gpus[1].PCIBusID
	onGPU := func(bus string) string {
		return `profile == "1g.10gb" && device.attributes["resource.kubernetes.io"].pciBusID == "` + bus + `"`
	}
	c := e.claim(request{name: "on", cel: onGPU(on)}, request{name: "off", cel: onGPU(off)})
	mig := deviceOf(t, c, "off")
	_, err := e.prepare(c)
	wantRefused(t, err, c, `request "off", device `+mig, "needs MIG mode on on GPU "+off, "which has it off", "gpus.settings: Leave")
	if calls := e.hw.Calls(); len(calls) != 0 {
		t.Errorf("calls reached the hardware: %v", calls)
	}
	e.wantAsBefore(t, before, "after the refused prepare")
	if rec, ok := e.checkpointRecord(c.UID); ok {
		t.Errorf("the refused claim is recorded: %+v", rec)
	}
}

// A claim with time-slicing is refused under Leave, naming the claim, the
// field and the setting and saying what to do; nothing is changed.
func TestLeaveRefusesTimeSlicing(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	e.restartWith(config.SettingsLeave)
	before := e.hwState()
	c := e.claim(request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}`)})
	_, err := e.prepare(c)
	wantRefused(t, err, c, `request "gpu"`, `sharing.strategy: Invalid value: "TimeSlicing"`, "gpus.settings: Leave",
		"leave sharing out", "use MPS", "gpus.settings: Manage")
	if calls := e.hw.Calls(); len(calls) != 0 {
		t.Errorf("calls reached the hardware: %v", calls)
	}
	e.wantAsBefore(t, before, "after the refused prepare")
}

// An MPS claim and GPU shares under Leave: their daemons start and serve
// the GPUs in the compute mode they have (Default), no setting call is
// made, and the log says once per GPU what Default costs under MPS.
func TestLeaveMPSAndShares(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", true)
	e.restartWith(config.SettingsLeave)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	e.ctx = klog.NewContext(context.Background(), logger)
	before := e.hwState()

	mpsClaim := e.claim(request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}`)})
	shares := []*resourceapi.ResourceClaim{e.claim(shareOf("s", "10Gi", "40")), e.claim(shareOf("s", "20Gi", "30"))}
	for _, c := range append([]*resourceapi.ResourceClaim{mpsClaim}, shares...) {
		e.mustPrepare(c)
	}
	ids := e.driver.MPS().IDs()
	if len(ids) != 2 {
		t.Fatalf("MPS daemons %v, want the claim's and the shares' GPU's", ids)
	}
	for _, id := range ids {
		if starts, _ := e.daemonLog(id); len(starts) != 1 {
			t.Errorf("daemon %s started %q, want once", id, starts)
		}
	}
	if got := e.mpsProcesses(); len(got) != 2 {
		t.Errorf("daemons running %v, want 2", got)
	}
	for _, g := range e.gpus {
		if mode, _ := e.nvml.ComputeMode(g.PCIBusID); mode != nvml.ComputeDefault {
			t.Errorf("GPU %s: compute mode %s, the agent leaves it Default", g.PCIBusID, mode)
		}
	}
	if rec, _ := e.checkpointRecord(mpsClaim.UID); rec.Devices[0].Sharing == nil || rec.Devices[0].Sharing.ComputeMode != "" {
		t.Errorf("the MPS claim's record says a compute mode was set: %+v", rec.Devices[0].Sharing)
	}
	if keys := e.ledgerKeys(); len(keys) != 0 {
		t.Errorf("ledger %v: no setting was changed", keys)
	}
	e.wantNoSettingCall(t, "after the prepares")

	// One explanation per GPU, though the shares' GPU took two claims.
	buf := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	told := map[string]int{}
	gpuRE := regexp.MustCompile(`gpu="([^"]+)"`)
	for _, line := range strings.Split(buf, "\n") {
		if strings.Contains(line, "MPS serves a GPU in compute mode Default") {
			if m := gpuRE.FindStringSubmatch(line); m != nil {
				told[m[1]]++
			}
		}
	}
	want := map[string]int{e.gpus[0].PCIBusID: 1, e.gpus[1].PCIBusID: 1}
	if !maps.Equal(told, want) {
		t.Errorf("explained per GPU %v, want %v; log:\n%s", told, want, buf)
	}

	for _, c := range append(shares, mpsClaim) {
		e.unprepare(c)
	}
	e.wantAsBefore(t, before, "after unprepare")
	e.wantNoSettingCall(t, "after unprepare")
}

// Settings the agent changed under Manage (an MPS claim's
// ExclusiveProcess, a MIG claim's MIG mode) are still restored under
// Leave once no claim uses the GPU: the ledger's entries from before the
// switch undo the agent's own changes, and the GPUs end as the operator
// had them. Until then the MIG mode stays as the running claim needs it,
// and a MIG claim that needs that mode now prepares without a switch
// (the live mode decides, not the slices' view of the mode before).
func TestLeaveRestoresSettingsChangedUnderManage(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", true)
	before := e.hwState()
	mpsClaim := e.claim(request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS"}`)})
	e.mustPrepare(mpsClaim)
	first := e.claim(request{name: "mig", cel: `profile == "1g.10gb"`})
	e.mustPrepare(first)
	mpsGPU := e.gpuOf(deviceOf(t, mpsClaim, "gpu")).PCIBusID
	migGPU := e.gpuOf(deviceOf(t, first, "mig")).PCIBusID
	if mpsGPU == migGPU {
		t.Fatalf("both claims on GPU %s", mpsGPU)
	}
	keys := e.ledgerKeys()
	for _, k := range []string{settingsKey(mpsGPU), migKey(migGPU)} {
		if !slices.Contains(keys, k) {
			t.Fatalf("ledger %v lacks %s: the agent did not change the settings under Manage", keys, k)
		}
	}

	e.restartWith(config.SettingsLeave)
	managed := e.settingCalls()
	second := e.claim(request{name: "mig", cel: `profile == "1g.10gb"`})
	if g := e.gpuOf(deviceOf(t, second, "mig")).PCIBusID; g != migGPU {
		t.Fatalf("the second MIG claim went to %s, not to the GPU in MIG mode %s", g, migGPU)
	}
	e.mustPrepare(second)
	e.unprepare(mpsClaim)
	if mode, _ := e.nvml.ComputeMode(mpsGPU); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s once the MPS claim went: not restored", mode)
	}
	e.unprepare(first)
	if on, _ := e.nvml.MIGEnabled(migGPU); !on {
		t.Error("MIG mode switched off while a claim still uses a partition")
	}
	e.unprepare(second)
	e.wantAsBefore(t, before, "after the last claim went")

	// Under Leave exactly the restores reached the GPUs: one compute mode
	// and one MIG mode call.
	restores := e.settingCallsSince(managed)
	want := map[string]map[string]int{mpsGPU: {persist.CallSetComputeMode: 1}, migGPU: {persist.CallSetMigMode: 1}}
	if !reflect.DeepEqual(restores, want) {
		t.Errorf("setting calls under Leave %v, want the two restores %v", restores, want)
	}
}

// Settings entries the ledger holds from before the switch to Leave with
// no claim left to use the GPU (the agent stopped before it could restore
// them) are restored at start under Leave, by the start-up reclaim: the
// compute mode and time slice of one GPU, the MIG mode of another. Only
// those restores reach the GPUs.
func TestLeaveReclaimRestoresLeftSettings(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", true)
	before := e.hwState()
	shared, mig := e.gpus[0], e.gpus[1].PCIBusID
	// What an agent under Manage leaves when it stops right after the
	// changes: each ledger entry, then its change.
	for key, entry := range map[string]ledgerEntry{
		settingsKey(shared.PCIBusID): {GPU: shared.PCIBusID, ComputeMode: nvml.ComputeDefault, TimeSlice: new(int)},
		migKey(mig):                  {GPU: mig, MIGEnabled: new(false)},
	} {
		if err := e.driver.ledger.Put(key, entry); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nvml.SetComputeMode(shared.PCIBusID, nvml.ComputeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	if err := e.driver.programs.SetTimeSlice(context.Background(), shared.UUID, 3); err != nil {
		t.Fatal(err)
	}
	if err := e.nvml.SetMIGMode(mig, true); err != nil {
		t.Fatal(err)
	}
	managed := e.settingCalls()

	e.restartWith(config.SettingsLeave)
	e.wantAsBefore(t, before, "after the restart under Leave")
	restores := e.settingCallsSince(managed)
	want := map[string]map[string]int{
		shared.PCIBusID: {persist.CallSetComputeMode: 1, persist.CallSetTimeSlice: 1},
		mig:             {persist.CallSetMigMode: 1},
	}
	if !reflect.DeepEqual(restores, want) {
		t.Errorf("setting calls under Leave %v, want the restores %v", restores, want)
	}
}

// A driver asked for a setting it does not know is not made: it would
// otherwise manage the settings of a node meant to be left alone.
func TestUnknownSettingsRefused(t *testing.T) {
	_, err := New(Options{Published: &env{}, NodeName: testNode, StateDir: t.TempDir(), Settings: "leave"})
	if err == nil || !strings.Contains(err.Error(), `Settings "leave": want Manage or Leave`) {
		t.Errorf("error %v", err)
	}
}
