// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/health"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/procstat"
	"github.com/hwdra/hwdra/internal/state"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// Dedicated GPU shares: each runs under an MPS daemon of its own whose
// defaults are its limits; the GPU is in compute mode Default while one
// is on it.

// ask sends a command to a recorded daemon through the driver's control
// program, as an operator would, and returns its answer.
func (e *env) ask(id, command string) string {
	e.t.Helper()
	cmd := e.driver.programs.Command(context.Background(), mps.Control, []string{mps.PipeDirEnv + "=" + e.driver.MPS().Dirs(id).Pipe})
	cmd.Stdin = strings.NewReader(command + "\n")
	out, err := cmd.Output()
	if err != nil {
		e.t.Fatalf("daemon %s: %s: %v", id, command, err)
	}
	return strings.TrimSpace(string(out))
}

// daemonOfClaim is the MPS daemon a prepared claim's device runs under,
// from its record in the checkpoint, with its spec.
func (e *env) daemonOfClaim(c *resourceapi.ResourceClaim) (string, mps.Spec) {
	e.t.Helper()
	rec, ok := e.checkpointRecord(c.UID)
	if !ok || len(rec.Devices) != 1 || rec.Devices[0].Sharing == nil || rec.Devices[0].Sharing.MPS == "" {
		e.t.Fatalf("claim %s: record %+v names no MPS daemon", c.Name, rec)
	}
	id := rec.Devices[0].Sharing.MPS
	s, ok := e.driver.MPS().Spec(id)
	if !ok {
		e.t.Fatalf("claim %s: daemon %s is not recorded", c.Name, id)
	}
	return id, s
}

// computeMode is a GPU's compute mode now.
func (e *env) computeMode(gpu string) nvml.ComputeMode {
	e.t.Helper()
	mode, err := e.nvml.ComputeMode(gpu)
	if err != nil {
		e.t.Fatal(err)
	}
	return mode
}

// wantShareEnv checks a share's container: it reaches the daemon's pipe
// and is given the limits in its environment.
func (e *env) wantShareEnv(t *testing.T, c *resourceapi.ResourceClaim, id, compute, memory string) {
	t.Helper()
	res, err := e.prepare(c) // prepared: the same result again
	if err != nil {
		t.Fatal(err)
	}
	spec := e.inject(res)
	env := envOf(spec)
	if env[mps.ActiveThreadPercentageEnv] != compute || env[mps.PinnedMemoryLimitEnv] != memory || env[mps.PipeDirEnv] != mps.ContainerPipeDir {
		t.Errorf("%s: container env %v, want %s%% and %s", c.Name, env, compute, memory)
	}
	pipe := e.driver.MPS().Dirs(id).Pipe
	if !slices.ContainsFunc(spec.Mounts, func(m oci.Mount) bool { return m.Source == pipe && m.Destination == mps.ContainerPipeDir }) {
		t.Errorf("%s: the pipe directory of daemon %s is not mounted: %+v", c.Name, id, spec.Mounts)
	}
}

// A dedicated share starts a daemon of its own, for its claim, whose
// defaults are its limits (the mock daemon tells them back as the real
// one does), and its container gets the same limits; its record keeps
// them. The GPU stays in compute mode Default; unprepare stops the
// daemon and leaves nothing.
func TestDedicatedShare(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	before := e.hwState()
	g := e.gpus[0]
	c := e.claim(dedicatedShareOf("s", "10Gi", "40"))
	e.mustPrepare(c)
	id, s := e.daemonOfClaim(c)
	if s.Owner != string(c.UID) || !s.Share || !slices.Equal(s.Devices, []string{g.UUID}) || len(s.Serves) != 1 || s.Serves[0] != (hw.PartitionRef{GPU: g.PCIBusID}) {
		t.Errorf("daemon %+v, want the claim's own on GPU %s", s, g.UUID)
	}
	if id != mps.ID(string(c.UID), []string{g.UUID}) {
		t.Errorf("daemon ID %s", id)
	}
	starts, told := e.daemonLog(id)
	want := []string{"set_default_active_thread_percentage 40", "set_default_device_pinned_mem_limit 0 10240M", "get_default_active_thread_percentage"}
	if !slices.Equal(starts, []string{g.UUID}) || !slices.Equal(told, want) {
		t.Errorf("daemon started %q, told %q; want one start on %s, told %q", starts, told, g.UUID, want)
	}
	if got := e.ask(id, "get_default_active_thread_percentage"); got != "40.0" {
		t.Errorf("the daemon's default active thread percentage %q, want 40.0", got)
	}
	if got := e.ask(id, "get_default_device_pinned_mem_limit 0"); got != "10240M" {
		t.Errorf("the daemon's default pinned memory limit %q, want 10240M", got)
	}
	e.wantShareEnv(t, c, id, "40", "0=10240M")
	rec, _ := e.checkpointRecord(c.UID)
	if sh := rec.Devices[0].Sharing.Share; sh == nil || *sh != (ShareRecord{Memory: 10 << 30, Compute: 40, Dedicated: true}) {
		t.Errorf("the record's share %+v", sh)
	}
	if mode := e.computeMode(g.PCIBusID); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s under a dedicated share", mode)
	}
	if keys := e.ledgerKeys(); len(keys) != 0 {
		t.Errorf("ledger %v: the GPU was in Default already", keys)
	}
	e.unprepare(c)
	e.wantAsBefore(t, before, "after unprepare")
}

// A policed share's record keeps its limits too, not dedicated.
func TestPolicedShareRecord(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	c := e.claim(request{name: "s", cel: `type == "share"`, config: shareConfig(`{}`),
		capacity: map[resourceapi.QualifiedName]string{device.GPUCapMemory: "20Gi", device.GPUCapCompute: "30"}})
	e.mustPrepare(c)
	rec, _ := e.checkpointRecord(c.UID)
	if sh := rec.Devices[0].Sharing.Share; sh == nil || *sh != (ShareRecord{Memory: 20 << 30, Compute: 30}) {
		t.Errorf("the record's share %+v", sh)
	}
	if _, s := e.daemonOfClaim(c); s.Owner != mps.OwnerShares || s.Share {
		t.Errorf("a policed share's daemon %+v", s)
	}
	e.unprepare(c)
}

// A policed share, then a dedicated one, then another policed one on one
// GPU that started in Default: the first makes it ExclusiveProcess (its
// mode before in the ledger first), the dedicated one Default with a
// daemon of its own beside the policed shares' (which runs on,
// untouched), the third leaves it Default. When the dedicated share goes
// the GPU stays Default while policed shares remain; after the last the
// ledger restores it.
func TestPolicedThenDedicatedShare(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	before := e.hwState()
	g := e.gpus[0].PCIBusID
	policed := e.claim(shareOf("s", "20Gi", "40"))
	e.mustPrepare(policed)
	if mode := e.computeMode(g); mode != nvml.ComputeExclusiveProcess {
		t.Fatalf("compute mode %s under a policed share", mode)
	}
	shared, _ := e.daemonOfClaim(policed)

	dedicated := e.claim(dedicatedShareOf("s", "10Gi", "30"))
	e.mustPrepare(dedicated)
	own, _ := e.daemonOfClaim(dedicated)
	if own == shared {
		t.Fatalf("the dedicated share runs under the policed shares' daemon %s", shared)
	}
	if mode := e.computeMode(g); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s with a dedicated share on the GPU", mode)
	}
	if entry, ok := e.driver.ledger.Get(settingsKey(g)); !ok || entry.ComputeMode != nvml.ComputeDefault {
		t.Errorf("ledger's settings %+v, %v: want the mode before the first change, Default", entry, ok)
	}
	if got := e.mpsProcesses(); len(got) != 2 {
		t.Errorf("daemons running %v, want the policed shares' and the dedicated share's", got)
	}
	second := e.claim(shareOf("s", "5Gi", "10"))
	e.mustPrepare(second)
	if id, _ := e.daemonOfClaim(second); id != shared {
		t.Errorf("the second policed share runs under %s, not the policed shares' %s", id, shared)
	}
	if mode := e.computeMode(g); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s: a policed share beside a dedicated one made it so", mode)
	}
	if starts, told := e.daemonLog(shared); len(starts) != 1 || len(told) != 0 {
		t.Errorf("the policed shares' daemon started %q, told %q: want once, no defaults", starts, told)
	}
	e.wantShareEnv(t, policed, shared, "40", "0=20480M")
	e.wantShareEnv(t, dedicated, own, "30", "0=10240M")
	e.wantShareEnv(t, second, shared, "10", "0=5120M")

	e.unprepare(dedicated)
	if got := e.driver.MPS().IDs(); !slices.Equal(got, []string{shared}) {
		t.Errorf("daemons %v once the dedicated share went, want %s", got, shared)
	}
	if mode := e.computeMode(g); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s with policed shares left: stays Default until no claim uses the GPU", mode)
	}
	e.unprepare(policed)
	e.unprepare(second)
	e.wantAsBefore(t, before, "after the last share")
}

// A dedicated share first, on a GPU an operator made ExclusiveProcess,
// then a policed one: the dedicated share makes it Default (the mode
// before in the ledger), the policed share leaves it Default, and once
// both are gone the ledger gives it back ExclusiveProcess.
func TestDedicatedThenPolicedShare(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	g := e.gpus[0].PCIBusID
	if err := e.nvml.SetComputeMode(g, nvml.ComputeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	before := e.hwState()
	dedicated := e.claim(dedicatedShareOf("s", "10Gi", "30"))
	e.mustPrepare(dedicated)
	if mode := e.computeMode(g); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s under a dedicated share", mode)
	}
	if entry, ok := e.driver.ledger.Get(settingsKey(g)); !ok || entry.ComputeMode != nvml.ComputeExclusiveProcess {
		t.Errorf("ledger's settings %+v, %v: want ExclusiveProcess, the mode before", entry, ok)
	}
	if rec, _ := e.checkpointRecord(dedicated.UID); rec.Devices[0].Sharing.ComputeMode != nvml.ComputeDefault {
		t.Errorf("the record says compute mode %q was set", rec.Devices[0].Sharing.ComputeMode)
	}
	policed := e.claim(shareOf("s", "20Gi", "40"))
	e.mustPrepare(policed)
	if mode := e.computeMode(g); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s: the policed share made it so beside a dedicated one", mode)
	}
	if ids := e.driver.MPS().IDs(); len(ids) != 2 {
		t.Errorf("daemons %v, want two", ids)
	}
	e.unprepare(policed)
	e.unprepare(dedicated)
	e.wantAsBefore(t, before, "after both shares")
}

// Two dedicated shares on one GPU under Manage: a daemon each, each with
// its own defaults, the GPU in Default.
func TestTwoDedicatedShares(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	before := e.hwState()
	a, b := e.claim(dedicatedShareOf("s", "10Gi", "40")), e.claim(dedicatedShareOf("s", "20Gi", "30"))
	e.mustPrepare(a)
	e.mustPrepare(b)
	idA, _ := e.daemonOfClaim(a)
	idB, _ := e.daemonOfClaim(b)
	if idA == idB {
		t.Fatalf("both shares under daemon %s", idA)
	}
	for id, want := range map[string][2]string{idA: {"40.0", "10240M"}, idB: {"30.0", "20480M"}} {
		if got := [2]string{e.ask(id, "get_default_active_thread_percentage"), e.ask(id, "get_default_device_pinned_mem_limit 0")}; got != want {
			t.Errorf("daemon %s's defaults %v, want %v", id, got, want)
		}
	}
	if got := e.mpsProcesses(); len(got) != 2 {
		t.Errorf("daemons running %v, want 2", got)
	}
	if mode := e.computeMode(e.gpus[0].PCIBusID); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s", mode)
	}
	e.unprepare(a)
	e.unprepare(b)
	e.wantAsBefore(t, before, "after both shares")
}

// The chart's class dedicated-share.gpu.hwdra.io carries the isolation:
// a claim of it without config of its own gets a dedicated share; a
// claim's own GpuConfig replaces the class's (the last config wins), so
// one that says Policed gets a policed share.
func TestDedicatedShareFromTheClass(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	e.alloc.AddClasses(classes...)
	before := e.hwState()
	fromClass := shareOf("s", "10Gi", "40")
	fromClass.class = "dedicated-share.gpu.hwdra.io"
	c := e.claim(fromClass)
	if cfg := c.Status.Allocation.Devices.Config; len(cfg) != 1 || cfg[0].Source != resourceapi.AllocationConfigSourceClass {
		t.Fatalf("the allocation's config %+v, want the class's", cfg)
	}
	e.mustPrepare(c)
	if _, s := e.daemonOfClaim(c); s.Owner != string(c.UID) || !s.Share {
		t.Errorf("a share of the dedicated class runs under %+v", s)
	}
	overridden := fromClass
	overridden.config = shareConfig(`{"isolation": "Policed"}`)
	o := e.claim(overridden)
	e.mustPrepare(o)
	if _, s := e.daemonOfClaim(o); s.Owner != mps.OwnerShares {
		t.Errorf("a share whose claim says Policed runs under %+v", s)
	}
	e.unprepare(o)
	e.unprepare(c)
	e.wantAsBefore(t, before, "after unprepare")
}

// Share settings on a device that is no share fail the prepare naming
// the claim, the request, the config they came from and the field, with
// nothing changed.
func TestShareConfigRefused(t *testing.T) {
	for _, tc := range []struct{ name, profile, cel, kind string }{
		{"a whole GPU", "gpus: [{model: h100-80gb, count: 1}]", `profile == "full"`, "gpu"},
		{"a MIG partition", "h100-mig", `profile == "1g.10gb"`, "mig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, false)
			before := e.hwState()
			c := e.claim(request{name: "g", cel: tc.cel, config: shareConfig(`{"isolation": "Dedicated"}`)})
			_, err := e.prepare(c)
			wantRefused(t, err, c, `request "g", device `+deviceOf(t, c, "g"), "config[0] from the claim",
				"share: Forbidden: only a GPU share (device type share) takes share settings", "is of type "+tc.kind)
			e.wantAsBefore(t, before, "after the refused prepare")
			if _, ok := e.checkpointRecord(c.UID); ok {
				t.Error("the refused claim is recorded")
			}
		})
	}
}

// A dedicated share whose prepare fails once its daemon runs (beside the
// GPU's policed shares' daemon) is rolled back: its daemon stopped and
// removed, the policed shares' daemon left running, untouched.
func TestFailedDedicatedShareLeavesNoDaemon(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	policed := e.claim(shareOf("s", "20Gi", "40"))
	e.mustPrepare(policed)
	shared, _ := e.daemonOfClaim(policed)
	running := e.mpsProcesses()
	dedicated := e.claim(dedicatedShareOf("s", "10Gi", "30"))
	e.restart(func(what string) error {
		if what == "mps" {
			return errInjected
		}
		return nil
	})
	if _, err := e.prepare(dedicated); err == nil || !strings.Contains(err.Error(), errInjected.Error()) {
		t.Fatalf("prepare: %v", err)
	}
	if ids := e.driver.MPS().IDs(); !slices.Equal(ids, []string{shared}) {
		t.Errorf("daemons recorded %v, want only the policed shares' %s", ids, shared)
	}
	if got := e.mpsProcesses(); !slices.Equal(got, running) {
		t.Errorf("daemons running %v, want %v", got, running)
	}
	if starts, _ := e.daemonLog(shared); len(starts) != 1 {
		t.Errorf("the policed shares' daemon started %d times", len(starts))
	}
	if _, ok := e.checkpointRecord(dedicated.UID); ok {
		t.Error("the failed claim is recorded")
	}
	e.restart(nil)
	e.unprepare(policed)
}

var errInjected = errorString("injected failure")

type errorString string

func (e errorString) Error() string { return string(e) }

// Under gpus.settings Leave the agent makes no GPU Default: on a GPU in
// ExclusiveProcess a share that would put a second MPS daemon there is
// refused before anything is applied (a dedicated share beside the
// policed shares' daemon, a policed or a dedicated share beside a
// dedicated share's), naming the GPU, its mode, the setting and what to
// do; a share alone is fine, and so are both kinds on a GPU in Default.
// No setting call reaches the GPUs.
func TestLeaveShares(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", true)
	exclusive, def := e.gpus[0].PCIBusID, e.gpus[1].PCIBusID
	if err := e.nvml.SetComputeMode(exclusive, nvml.ComputeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	e.restartWith(config.SettingsLeave)
	before := e.hwState()
	operator := e.settingCalls()
	on := func(r request, gpu string) request {
		r.cel += ` && device.attributes["resource.kubernetes.io"].pciBusID == "` + gpu + `"`
		return r
	}
	refused := func(r request, whose string, want ...string) {
		t.Helper()
		c := e.claim(r)
		defer e.alloc.Release(c)
		daemons := e.driver.MPS().IDs()
		_, err := e.prepare(c)
		wantRefused(t, err, c, append([]string{`request "s", device ` + deviceOf(t, c, "s"), "GPU " + exclusive + " is in compute mode ExclusiveProcess",
			"only one MPS server can hold a context", whose, "gpus.settings: Leave", "set the GPU's compute mode to Default with the tool that owns it",
			"gpus.settings: Manage"}, want...)...)
		if got := e.driver.MPS().IDs(); !slices.Equal(got, daemons) {
			t.Errorf("daemons %v after the refusal, were %v", got, daemons)
		}
		if _, ok := e.checkpointRecord(c.UID); ok {
			t.Error("the refused claim is recorded")
		}
	}

	// The policed shares' daemon on the exclusive GPU: a dedicated share
	// is refused; another policed share runs under the same daemon.
	policed := e.claim(on(shareOf("s", "20Gi", "40"), exclusive))
	e.mustPrepare(policed)
	refused(on(dedicatedShareOf("s", "10Gi", "30"), exclusive), "(the GPU's policed shares)", "take a policed share")
	second := e.claim(on(shareOf("s", "10Gi", "10"), exclusive))
	e.mustPrepare(second)
	for _, c := range []*resourceapi.ResourceClaim{policed, second} {
		e.unprepare(c)
		e.alloc.Release(c)
	}

	// A dedicated share alone on the exclusive GPU runs; a policed share
	// and another dedicated one are refused beside it.
	dedicated := e.claim(on(dedicatedShareOf("s", "10Gi", "30"), exclusive))
	e.mustPrepare(dedicated)
	whose := "(claim " + string(dedicated.UID) + "'s dedicated share)"
	refused(on(shareOf("s", "20Gi", "40"), exclusive), whose, "wait for that daemon's claim to go")
	refused(on(dedicatedShareOf("s", "20Gi", "40"), exclusive), whose, "wait for that daemon's claim to go")

	// On the GPU in Default both kinds run side by side.
	both := []*resourceapi.ResourceClaim{e.claim(on(shareOf("s", "20Gi", "40"), def)), e.claim(on(dedicatedShareOf("s", "10Gi", "30"), def))}
	for _, c := range both {
		e.mustPrepare(c)
	}
	if got := e.mpsProcesses(); len(got) != 3 {
		t.Errorf("daemons running %v, want 3", got)
	}
	for _, c := range append(both, dedicated) {
		e.unprepare(c)
	}
	e.wantAsBefore(t, before, "after unprepare")
	if calls := e.settingCallsSince(operator); len(calls) != 0 {
		t.Errorf("setting calls under Leave: %v", calls)
	}
}

// daemonPID is the PID the mock daemon of id wrote.
func (e *env) daemonPID(id string) int {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.driver.MPS().Dirs(id).Pipe, drivertools.PIDFile))
	if err != nil {
		e.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		e.t.Fatal(err)
	}
	return pid
}

// A dedicated share's daemon that dies is started again by the MPS
// monitor, and its fault lands on the GPU's share device (the device
// every share of the GPU is, policed or dedicated: the kubelet's health
// knows devices, not shares), not on the whole GPU nor any other device;
// the policed shares' daemon is left alone. The same the other way round.
func TestDedicatedShareDaemonDown(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	policed, dedicated := e.claim(shareOf("s", "20Gi", "40")), e.claim(dedicatedShareOf("s", "10Gi", "30"))
	e.mustPrepare(policed)
	e.mustPrepare(dedicated)
	shared, _ := e.daemonOfClaim(policed)
	own, _ := e.daemonOfClaim(dedicated)
	m := health.NewMPSMonitor(e.driver.MPS(), time.Hour, func() {})
	ctx := context.Background()
	shareDevice := device.GPUName(e.gpus[0].PCIBusID) + "-share"
	faulted := func() []string {
		t.Helper()
		h := hw.Health{MPS: m.Faults()}
		var out []string
		for name, dev := range e.driver.catalog() {
			if f, ok := dev.Fault(h); ok {
				out = append(out, name+": "+f.Reason)
			}
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		name       string
		kill, keep string
	}{
		{"the dedicated share's daemon", own, shared},
		{"the policed shares' daemon", shared, own},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keepPID := e.daemonPID(tc.keep)
			killed := e.daemonPID(tc.kill)
			if err := syscall.Kill(killed, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// Dead (a zombie or reaped) as the manager's check reads it.
			waitfor.True(t, fmt.Sprintf("daemon %s (PID %d) dead after SIGKILL", tc.kill, killed), 10*time.Second, func() bool {
				_, err := procstat.StartTime(killed)
				return err != nil
			})
			m.Check(ctx)
			if got, want := faulted(), []string{shareDevice + ": MPSDaemonDown"}; !slices.Equal(got, want) {
				t.Errorf("devices faulted %v, want %v", got, want)
			}
			if f := m.Faults(); len(f) != 1 || !strings.Contains(f[hw.MPSRef{PartitionRef: hw.PartitionRef{GPU: e.gpus[0].PCIBusID}, Shares: true}].Message, tc.kill) {
				t.Errorf("faults %v, want one naming daemon %s", f, tc.kill)
			}
			if err := e.driver.MPS().Check(ctx, tc.kill); err != nil {
				t.Errorf("daemon %s not started again: %v", tc.kill, err)
			}
			if pid := e.daemonPID(tc.keep); pid != keepPID {
				t.Errorf("daemon %s restarted too (PID %d, was %d)", tc.keep, pid, keepPID)
			}
			m.Check(ctx)
			if got := faulted(); len(got) != 0 {
				t.Errorf("devices faulted %v once the daemon is back", got)
			}
		})
	}
	e.unprepare(dedicated)
	e.unprepare(policed)
}

// A policed share prepared by an agent before dedicated shares (its
// record without share, in checkpoint version 2) is read by this one:
// known as the GPU's user and its daemon's, a dedicated share prepares
// beside it, and both unprepare to nothing left.
func TestShareRecordOfAnOlderAgent(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	before := e.hwState()
	old := e.claim(shareOf("s", "20Gi", "40"))
	e.mustPrepare(old)
	path := filepath.Join(e.dir, "state", DriverName+".checkpoint.json")
	data, err := state.Read(path, state.CheckpointFormat)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"share":{"memory":21474836480,"compute":40}`) {
		t.Fatalf("checkpoint %s: no share record", data)
	}
	data = []byte(strings.Replace(string(data), `,"share":{"memory":21474836480,"compute":40}`, "", 1))
	doc := strings.Replace(string(state.CheckpointFormat.Encode(data)), "hwdra.io/checkpoint/v3", "hwdra.io/checkpoint/v2", 1)
	if err := state.Replace(path, []byte(doc)); err != nil {
		t.Fatal(err)
	}
	e.restart(nil)
	rec, ok := e.checkpointRecord(old.UID)
	if !ok || rec.Devices[0].Sharing == nil || rec.Devices[0].Sharing.MPS == "" || rec.Devices[0].Sharing.Share != nil {
		t.Fatalf("the older record read as %+v (%v)", rec, ok)
	}
	dedicated := e.claim(dedicatedShareOf("s", "10Gi", "30"))
	e.mustPrepare(dedicated)
	if ids := e.driver.MPS().IDs(); len(ids) != 2 {
		t.Errorf("daemons %v, want the older share's and the dedicated share's", ids)
	}
	e.unprepare(dedicated)
	e.unprepare(old)
	e.wantAsBefore(t, before, "after both shares")
}
