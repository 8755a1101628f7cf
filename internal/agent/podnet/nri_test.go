// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare/nic"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// oneCX7: a ConnectX-7 PF at 400G with 4 VFs, each with an RDMA device.
const oneCX7 = `nics: [{model: cx7, count: 1, vfs: 4, pciAddresses: ["0000:17:00.0"], netdevs: [pfa]}]`

const fullConfig = `, "interfaceName": "fast0", "mtu": 9000, "mac": "02:aa:00:00:00:01",
	"addresses": ["10.9.0.5/24", "fd00:9::5/64"],
	"routes": [{"destination": "10.10.0.0/16", "gateway": "10.9.0.1"}, {"destination": "fd00:10::/64"}]`

func (e *env) vfOf(c *resourceapi.ResourceClaim) nic.VF {
	e.t.Helper()
	pc, ok := e.nic.Claims()[c.UID]
	if !ok || len(pc.Record.VFs) == 0 {
		e.t.Fatalf("claim %s is not prepared with a VF", c.Name)
	}
	return pc.Record.VFs[0]
}

// TestPodGetsItsVF: after RunPodSandbox the VF is in the pod's namespace
// with the configured name, MTU, MAC, addresses and routes, and up; its
// metadata has networkData and the claim's status says the same; each
// hook twice changes nothing; after StopPodSandbox it is back on the host
// with its original name and settings, and unprepare restores the VF.
func TestPodGetsItsVF(t *testing.T) {
	e := newEnv(t, oneCX7)
	pristine := links(t, e.host)
	sb := e.newPod("a")
	c := e.claim(fullConfig, []*api.PodSandbox{sb}, "nic")
	e.mustPrepare(c)
	vf := e.vfOf(c)
	prepared := links(t, e.host)
	slicesBefore := e.nicSlices()

	if err := e.runPod(sb); err != nil {
		t.Fatal(err)
	}
	podPath := netnsPath(sb)
	inPod := links(t, podPath)
	want := sriov.LinkState{Name: "fast0", MTU: 9000, MAC: "02:aa:00:00:00:01", Up: true, Addresses: []string{"10.9.0.5/24", "fd00:9::5/64"}}
	if !reflect.DeepEqual(inPod["fast0"], want) || len(inPod) != 1 {
		t.Errorf("in the pod: %+v, want only %+v", inPod, want)
	}
	if got, w := routes(t, podPath, "fast0"), []string{"10.10.0.0/16 via 10.9.0.1", "fd00:10::/64"}; !containsAll(got, w) {
		t.Errorf("routes in the pod %v, want %v among them", got, w)
	}
	if _, ok := links(t, e.host)[vf.Netdev]; ok {
		t.Errorf("%s still in the host namespace", vf.Netdev)
	}
	// The VF left the host's sysfs with its netdev, but not the slices.
	waitfor.True(t, "sysfs without the netdev", 10*time.Second, func() bool { _, nd, _ := sriov.FunctionState(e.hw.Sysfs, vf.PCIAddress); return nd == "" })
	if got := e.nicSlices(); !reflect.DeepEqual(got, slicesBefore) {
		t.Errorf("a VF in a pod changed the published NIC devices:\n%+v\nwas\n%+v", got, slicesBefore)
	}

	calls := e.meta.Calls()
	if len(calls) != 1 || calls[0].Claim != c.UID || calls[0].Request != "nic" || len(calls[0].Devices) != 1 {
		t.Fatalf("metadata writes %+v, want one for request nic", calls)
	}
	md := calls[0].Devices[0].Metadata
	nd := md.NetworkData
	if nd == nil || nd.InterfaceName != "fast0" || strings.Join(nd.IPs, ",") != "10.9.0.5/24,fd00:9::5/64" || nd.HardwareAddress != "02:aa:00:00:00:01" {
		t.Errorf("networkData %+v", nd)
	}
	if a := md.Attributes["resource.kubernetes.io/pciBusID"]; a.StringValue == nil || *a.StringValue != vf.PCIAddress {
		t.Errorf("metadata lost the device's attributes: %v", md.Attributes)
	}
	st := e.claimStatus(c, func(d []resourceapi.AllocatedDeviceStatus) bool { return len(d) == 1 })
	if r := condition(st[0], metadata.ConditionReady); r == nil || r.Status != "True" || condition(st[0], metadata.ConditionNetworkReady).Status != "True" ||
		st[0].NetworkData == nil || !reflect.DeepEqual(*st[0].NetworkData, *nd) || st[0].ShareID == nil || types.UID(*st[0].ShareID) != *vf.ShareID {
		t.Errorf("claim status %+v", st[0])
	}

	// Twice: nothing changes, no second metadata generation.
	if err := e.runPod(sb); err != nil {
		t.Fatal(err)
	}
	if again := links(t, podPath); !reflect.DeepEqual(again, inPod) || len(e.meta.Calls()) != 1 {
		t.Errorf("a second RunPodSandbox changed things: %+v, %d metadata writes", again, len(e.meta.Calls()))
	}

	e.stopPod(sb)
	if got := links(t, e.host); !reflect.DeepEqual(got, prepared) {
		t.Errorf("after StopPodSandbox the host has\n%+v\nwant\n%+v", got, prepared)
	}
	if got := links(t, podPath); len(got) != 0 {
		t.Errorf("left in the pod: %+v", got)
	}
	e.stopPod(sb)
	e.removePod(sb)
	if got := links(t, e.host); !reflect.DeepEqual(got, prepared) || len(e.placements()) != 0 {
		t.Errorf("a second stop hook changed things: %+v, placements %v", got, e.placements())
	}
	if err := e.unprepare(c); err != nil {
		t.Fatal(err)
	}
	if got := links(t, e.host); !reflect.DeepEqual(got, pristine) {
		t.Errorf("after unprepare the host has\n%+v\nwant\n%+v", got, pristine)
	}
}

// nicSlices is what the agent would publish now.
func (e *env) nicSlices() []resourceapi.Device {
	e.t.Helper()
	pfs, err := sriov.Discover(sriov.Options{SysfsRoot: e.hw.Sysfs, Routes: e.hw.NICs(), Eswitch: e.hw.NICs()})
	if err != nil {
		e.t.Fatal(err)
	}
	offers, _ := config.Default().Resolve(pfs)
	res, _ := resources.NIC(testNode, offers, device.AllFeatures)
	return res.Pools[testNode].Slices[0].Devices
}

// TestDefaultNamesAndStopWithoutNetns: two VFs without a configured name
// are net1 and net2; a StopPodSandbox without the namespace (containerd
// can leave it out) returns them through the recorded path.
func TestDefaultNamesAndStopWithoutNetns(t *testing.T) {
	e := newEnv(t, oneCX7)
	sb := e.newPod("a")
	c := e.claim("", []*api.PodSandbox{sb}, "a", "b")
	e.mustPrepare(c)
	prepared := links(t, e.host)
	if err := e.runPod(sb); err != nil {
		t.Fatal(err)
	}
	inPod := links(t, netnsPath(sb))
	if len(inPod) != 2 || !inPod["net1"].Up || !inPod["net2"].Up {
		t.Fatalf("in the pod: %+v, want net1 and net2, up", inPod)
	}
	e.stopPod(&api.PodSandbox{Id: sb.Id, Name: sb.Name, Namespace: sb.Namespace, Uid: sb.Uid})
	if got := links(t, e.host); !reflect.DeepEqual(got, prepared) {
		t.Errorf("after a stop hook without the namespace:\n%+v\nwant\n%+v", got, prepared)
	}
}

// TestNamespaceGoneBeforeStop: the pod's namespace is destroyed before
// the stop hook (the VF returns to the host by itself, named by the
// kernel); the hooks do not wait for it, unprepare does and gives it its
// name and settings back.
func TestNamespaceGoneBeforeStop(t *testing.T) {
	// A hook that waited for the VF could wait up to 20 s; the bound
	// below is far past what a loaded race run adds to hooks that do
	// not (500ms was not). The mock returns a VF within moments, so
	// this catches only a hook stuck waiting.
	e := newEnvReturnWait(t, oneCX7, 20*time.Second)
	pristine := links(t, e.host)
	initial := e.hw.NICs().VFConfigurator().Snapshot()
	sb := e.newPod("a")
	c := e.claim(fullConfig, []*api.PodSandbox{sb}, "nic")
	e.mustPrepare(c)
	if err := e.runPod(sb); err != nil {
		t.Fatal(err)
	}
	e.removeNetns(sb)
	start := time.Now()
	e.stopPod(sb)
	e.removePod(sb)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("stop and remove hooks took %v with the namespace gone: they waited for the VF", d)
	}
	if err := e.unprepare(c); err != nil {
		t.Fatal(err)
	}
	if got := links(t, e.host); !reflect.DeepEqual(got, pristine) {
		t.Errorf("host after unprepare:\n%+v\nwant\n%+v", got, pristine)
	}
	if got := e.hw.NICs().VFConfigurator().Snapshot(); !reflect.DeepEqual(got, initial) {
		t.Errorf("VF settings not restored: %+v", got)
	}
	if p := e.placements(); len(p) != 0 {
		t.Errorf("placements left: %v", p)
	}
}

// TestUnprepareWithoutStopHook: no stop hook ever came (NRI was down);
// unprepare takes the VF out of the running pod's namespace.
func TestUnprepareWithoutStopHook(t *testing.T) {
	e := newEnv(t, oneCX7)
	pristine := links(t, e.host)
	sb := e.newPod("a")
	c := e.claim(fullConfig, []*api.PodSandbox{sb}, "nic")
	e.mustPrepare(c)
	if err := e.runPod(sb); err != nil {
		t.Fatal(err)
	}
	if err := e.unprepare(c); err != nil {
		t.Fatal(err)
	}
	if got := links(t, e.host); !reflect.DeepEqual(got, pristine) {
		t.Errorf("host after unprepare:\n%+v\nwant\n%+v", got, pristine)
	}
	if got := links(t, netnsPath(sb)); len(got) != 0 {
		t.Errorf("left in the pod: %+v", got)
	}
}

// TestRollback: a failure half-way through a pod's VFs (after the second
// one moved) undoes everything done for the pod, fails the hook with an
// error naming the claim and device, writes no metadata and says why in
// the claims' status. A failed metadata write rolls back the same way.
func TestRollback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		second   string // VfConfig of the pod's second claim
		metaFail error
		want     string
	}{
		{"unreachable gateway", `, "addresses": ["10.9.0.6/24"], "routes": [{"destination": "10.20.0.0/16", "gateway": "192.168.77.1"}]`, nil, "route to 10.20.0.0/16"},
		{"interface name taken", `, "interfaceName": "net1"`, nil, `both ask for interface name "net1"`},
		{"metadata write fails", "", errors.New("disk full"), "disk full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, oneCX7)
			sb := e.newPod("a")
			first := e.claim(`, "interfaceName": "net1", "addresses": ["10.9.0.5/24"]`, []*api.PodSandbox{sb}, "nic")
			second := e.claim(tc.second, []*api.PodSandbox{sb}, "nic")
			e.mustPrepare(first)
			e.mustPrepare(second)
			prepared := links(t, e.host)
			e.meta.fail = tc.metaFail
			err := e.runPod(sb)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("RunPodSandbox: %v, want an error with %q", err, tc.want)
			}
			if tc.metaFail == nil && !strings.Contains(err.Error(), "claim ns/"+second.Name) {
				t.Errorf("error does not name the claim %s: %v", second.Name, err)
			}
			if !strings.Contains(err.Error(), "nic-0000-17-00-0") {
				t.Errorf("error does not name the device: %v", err)
			}
			if got := links(t, e.host); !reflect.DeepEqual(got, prepared) {
				t.Errorf("host after the rollback:\n%+v\nwant\n%+v", got, prepared)
			}
			if got := links(t, netnsPath(sb)); len(got) != 0 {
				t.Errorf("left in the pod: %+v", got)
			}
			if p := e.placements(); len(p) != 0 {
				t.Errorf("placements left: %v", p)
			}
			if n := len(e.meta.Calls()); n != 0 {
				t.Errorf("%d metadata writes for a failed pod", n)
			}
			for _, c := range []*resourceapi.ResourceClaim{first, second} {
				st := e.claimStatus(c, func(d []resourceapi.AllocatedDeviceStatus) bool { return len(d) == 1 })
				if r := condition(st[0], metadata.ConditionReady); r == nil || r.Status != "False" || r.Reason != metadata.ReasonNetworkSetupFailed || !strings.Contains(r.Message, tc.want) {
					t.Errorf("claim %s status %+v", c.Name, st[0].Conditions)
				}
			}
			// The kubelet retries the sandbox: with the cause gone it works.
			e.meta.fail = nil
			if tc.metaFail != nil {
				if err := e.runPod(sb); err != nil {
					t.Fatalf("retry: %v", err)
				}
				e.claimStatus(first, func(d []resourceapi.AllocatedDeviceStatus) bool {
					return len(d) == 1 && condition(d[0], metadata.ConditionReady).Status == "True"
				})
			}
		})
	}
}

// TestHostNetworkPod: a pod in the host's network namespace asking for a
// VF gets a clear error.
func TestHostNetworkPod(t *testing.T) {
	e := newEnv(t, oneCX7)
	sb := &api.PodSandbox{Id: "sb-h", Name: "h", Namespace: "ns", Uid: "uid-pod-h", Linux: &api.LinuxPodSandbox{}}
	c := e.claim("", []*api.PodSandbox{sb}, "nic")
	e.mustPrepare(c)
	err := e.runPod(sb)
	if err == nil || !strings.Contains(err.Error(), "uses the host's network namespace") || !strings.Contains(err.Error(), c.Name) {
		t.Errorf("RunPodSandbox of a host-network pod: %v", err)
	}
	if _, ok := links(t, e.host)[e.vfOf(c).Netdev]; !ok {
		t.Error("the VF left the host")
	}
}

// TestSynchronize: the agent restarts (SIGKILL: nothing undone) while
// pods run. Meanwhile pod b stops and its namespace goes, and pod c
// starts without the plugin. On reconnect, a's VF stays where it is (the
// same link), b's comes back (unprepare waits for it), c gets its VF. Then
// the runtime restarts: the plugin reconnects and a keeps its VF.
func TestSynchronize(t *testing.T) {
	e := newEnv(t, oneCX7)
	pristine := links(t, e.host)
	a, b, cpod := e.newPod("a"), e.newPod("b"), e.newPod("c")
	ca := e.claim(`, "addresses": ["10.9.0.5/24"]`, []*api.PodSandbox{a}, "nic")
	cb := e.claim("", []*api.PodSandbox{b}, "nic")
	cc := e.claim(`, "interfaceName": "late0"`, []*api.PodSandbox{cpod}, "nic")
	for _, c := range []*resourceapi.ResourceClaim{ca, cb, cc} {
		e.mustPrepare(c)
	}
	for _, p := range []*api.PodSandbox{a, b} {
		if err := e.runPod(p); err != nil {
			t.Fatal(err)
		}
	}
	ifindex := func() int {
		l, err := handle(t, netnsPath(a)).LinkByName("net1")
		if err != nil {
			t.Fatalf("a's VF: %v", err)
		}
		return l.Attrs().Index
	}
	before := ifindex()

	e.stopAgent()
	e.mu.Lock()
	delete(e.pods, types.UID(b.Uid))
	e.mu.Unlock()
	e.removeNetns(b)
	if err := e.runPod(cpod); err != nil { // no plugin: nothing happens
		t.Fatal(err)
	}
	if got := links(t, netnsPath(cpod)); len(got) != 0 {
		t.Fatalf("pod c got links without the plugin: %+v", got)
	}
	e.startAgent()
	e.waitReady()

	if got := ifindex(); got != before {
		t.Errorf("a's VF was moved again on resync: ifindex %d, was %d", got, before)
	}
	if got := links(t, netnsPath(cpod)); !got["late0"].Up {
		t.Errorf("pod c after resync: %+v, want late0 up", got)
	}
	if err := e.unprepare(cb); err != nil {
		t.Fatalf("unprepare b: %v", err)
	}
	if _, ok := links(t, e.host)[e.vfOf(ca).Netdev]; ok {
		t.Error("a's VF is in the host")
	}
	e.claimStatus(cc, func(d []resourceapi.AllocatedDeviceStatus) bool {
		return len(d) == 1 && d[0].NetworkData != nil && d[0].NetworkData.InterfaceName == "late0"
	})

	// The runtime restarts.
	e.stopRuntime()
	waitfor.True(t, "plugin notices the runtime is gone", 10*time.Second, func() bool { return e.net.Ready() != nil })
	if err := e.prepare(e.claim("", []*api.PodSandbox{e.newPod("d")}, "nic")); err == nil || !strings.Contains(err.Error(), "no NRI connection") {
		t.Errorf("prepare without NRI: %v", err)
	}
	e.startRuntime()
	e.waitReady()
	if got := ifindex(); got != before {
		t.Errorf("a's VF moved after the runtime restarted")
	}

	for _, p := range []*api.PodSandbox{a, cpod} {
		e.stopPod(p)
	}
	for _, c := range []*resourceapi.ResourceClaim{ca, cc} {
		if err := e.unprepare(c); err != nil {
			t.Fatal(err)
		}
	}
	if got := links(t, e.host); !reflect.DeepEqual(got, pristine) {
		t.Errorf("host at the end:\n%+v\nwant\n%+v", got, pristine)
	}
}

// TestRDMAFollowsTheNetdev: in exclusive mode the VF's RDMA device moves
// into the pod's namespace and back; in shared mode nothing moves.
func TestRDMAFollowsTheNetdev(t *testing.T) {
	for _, mode := range []string{"exclusive", "shared"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, "rdmaNetns: "+mode+"\n"+oneCX7)
			sb := e.newPod("a")
			c := e.claim("", []*api.PodSandbox{sb}, "nic")
			e.mustPrepare(c)
			rdma := e.vfOf(c).RDMADevice
			if rdma == "" {
				t.Fatal("the cx7 VF has no RDMA device")
			}
			r := e.hw.NICs().RDMA()
			if err := e.runPod(sb); err != nil {
				t.Fatal(err)
			}
			if mode == "shared" {
				if m := r.Moves(); len(m) != 0 {
					t.Errorf("RDMA moves in shared mode: %+v", m)
				}
				return
			}
			if got := r.Where(rdma); got != netnsPath(sb) {
				t.Errorf("RDMA device %s in %q, want the pod's namespace", rdma, got)
			}
			e.stopPod(sb)
			if got := r.Where(rdma); got != e.host {
				t.Errorf("RDMA device %s in %q after stop, want the host's", rdma, got)
			}
			for _, m := range r.Moves() {
				if m.Err != nil {
					t.Errorf("refused RDMA move %+v", m)
				}
			}
		})
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// TestVFGoneWithItsNamespace: the pod's namespace is gone and so is the
// VF (its PF's VFs were disabled): there is nothing to bring back, and
// the placement goes instead of failing every hook and unprepare.
func TestVFGoneWithItsNamespace(t *testing.T) {
	e := newEnv(t, oneCX7)
	sb := e.newPod("a")
	c := e.claim("", []*api.PodSandbox{sb}, "nic")
	e.mustPrepare(c)
	if err := e.runPod(sb); err != nil {
		t.Fatal(err)
	}
	vf := e.vfOf(c)
	e.removeNetns(sb)
	// The VF back in the host's namespace before it is unplugged, as the
	// kernel has it once the namespace is gone: the mock's watcher
	// otherwise wrote its netdev back after the removal (seen in CI).
	e.hw.NICs().Settle()
	if err := os.RemoveAll(filepath.Join(e.hw.Sysfs, "bus", "pci", "devices", vf.PCIAddress)); err != nil {
		t.Fatal(err)
	}
	e.stopPod(sb)
	if p := e.placements(); len(p) != 0 {
		t.Errorf("placements left for a VF that is gone: %v", p)
	}
	if err := e.unprepare(c); err != nil {
		t.Errorf("unprepare of a claim whose VF is gone: %v", err)
	}
}

// TestSharedClaimServesOnePodAtATime: a claim with a VF, prepared for pod
// a, also named by pod b (the kubelet prepares a claim once, so b is in no
// record; Pods knows it). b's sandbox is refused with an error that
// says why and what to do, and so is any container of b; the claim's
// status keeps a's interface (b's refusal is not the claim's failure).
// Once a is gone, b's next sandbox gets the VF.
func TestSharedClaimServesOnePodAtATime(t *testing.T) {
	e := newEnv(t, oneCX7)
	a, b := e.newPod("a"), e.newPod("b")
	c := e.claim("", []*api.PodSandbox{a}, "nic")
	e.mustPrepare(c)
	e.mu.Lock()
	e.uses[types.UID(b.Uid)] = []string{c.Name}
	e.mu.Unlock()
	if err := e.runPod(a); err != nil {
		t.Fatal(err)
	}
	e.claimStatus(c, func(d []resourceapi.AllocatedDeviceStatus) bool {
		return len(d) == 1 && condition(d[0], metadata.ConditionReady) != nil && condition(d[0], metadata.ConditionReady).Status == "True"
	})

	err := e.runPod(b)
	for _, want := range []string{"pod ns/b", "claim ns/" + c.Name, "is in pod ns/a", "a claim of its own"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("RunPodSandbox of the second pod: %v, want an error with %q", err, want)
		}
	}
	if got := links(t, netnsPath(b)); len(got) != 0 {
		t.Errorf("the refused pod has %v", got)
	}
	if err := e.rt.CreateContainer(e.ctx, b, &api.Container{Id: "c1", PodSandboxId: b.Id, Name: "app"}); err == nil || !strings.Contains(err.Error(), "is in pod ns/a") {
		t.Errorf("CreateContainer in the refused pod: %v", err)
	}
	if err := e.rt.CreateContainer(e.ctx, a, &api.Container{Id: "c2", PodSandboxId: a.Id, Name: "app"}); err != nil {
		t.Errorf("CreateContainer in the pod with the VF: %v", err)
	}
	// The hooks queue claim status before they answer: once the writer
	// has nothing pending, whatever they queued is stored.
	waitfor.True(t, "the queued claim status written", 10*time.Second, func() bool { return e.status.Pending() == 0 })
	st := e.claimStatus(c, func(d []resourceapi.AllocatedDeviceStatus) bool { return len(d) == 1 })
	if r := condition(st[0], metadata.ConditionReady); r == nil || r.Status != "True" {
		t.Errorf("the claim's status after the second pod was refused: %+v", st[0])
	}

	e.stopPod(a)
	e.removePod(a)
	if err := e.runPod(b); err != nil {
		t.Fatalf("the second pod once the first is gone: %v", err)
	}
	if got := links(t, netnsPath(b)); len(got) != 1 || got["net1"].Name != "net1" {
		t.Errorf("the second pod has %v, want net1", got)
	}
}

// TestCreateContainerAttachesMissingVFs: a sandbox the plugin never saw
// (it started while the plugin was away, and the runtime's resync did not
// list it) gets its VFs when its first container is created, before that
// container exists; a container of a pod whose VF cannot be attached is
// refused.
func TestCreateContainerAttachesMissingVFs(t *testing.T) {
	e := newEnv(t, oneCX7)
	sb := e.newPod("a")
	c := e.claim("", []*api.PodSandbox{sb}, "nic")
	e.mustPrepare(c)
	e.stopAgent()
	if err := e.rt.RunPodSandbox(e.ctx, sb); err != nil { // no plugin: nothing moves
		t.Fatal(err)
	}
	e.startAgent()
	e.waitReady()
	if got := links(t, netnsPath(sb)); len(got) != 0 {
		t.Fatalf("the pod has %v before any container", got)
	}
	if err := e.rt.CreateContainer(e.ctx, sb, &api.Container{Id: "c1", PodSandboxId: sb.Id, Name: "app"}); err != nil {
		t.Fatal(err)
	}
	if got := links(t, netnsPath(sb)); len(got) != 1 {
		t.Errorf("after CreateContainer the pod has %v, want its VF", got)
	}
	if calls := e.meta.Calls(); len(calls) != 1 || calls[0].Devices[0].Metadata.NetworkData == nil {
		t.Errorf("metadata writes %+v, want one with networkData", calls)
	}
	// A second container: nothing to do.
	if err := e.rt.CreateContainer(e.ctx, sb, &api.Container{Id: "c2", PodSandboxId: sb.Id, Name: "side"}); err != nil || len(e.meta.Calls()) != 1 {
		t.Errorf("second container: %v, %d metadata writes", err, len(e.meta.Calls()))
	}

	// A host-network pod's VF cannot be attached: its container is refused.
	hostNet := &api.PodSandbox{Id: "h", Uid: "uid-h", Namespace: "ns", Name: "h"}
	c2 := e.claim("", []*api.PodSandbox{hostNet}, "nic")
	e.mustPrepare(c2)
	if err := e.rt.CreateContainer(e.ctx, hostNet, &api.Container{Id: "c3", PodSandboxId: "h", Name: "app"}); err == nil || !strings.Contains(err.Error(), "host's network namespace") {
		t.Errorf("CreateContainer of a host-network pod with a VF: %v", err)
	}
}

// TestRequiresPlugin: the NRI annotation that makes the runtime's default
// validator refuse the pod's containers while this plugin is missing.
func TestRequiresPlugin(t *testing.T) {
	for _, tc := range []struct {
		annotations map[string]string
		want        bool
	}{
		{nil, false},
		{map[string]string{RequiredPluginsAnnotation + "/pod": `["hwdra-sriov"]`}, true},
		{map[string]string{RequiredPluginsAnnotation: "- other\n- 10-hwdra-sriov\n"}, true},
		{map[string]string{RequiredPluginsAnnotation + "/pod": `["other"]`}, false},
		{map[string]string{RequiredPluginsAnnotation + "/container.app": `["hwdra-sriov"]`}, false}, // one container only
		{map[string]string{RequiredPluginsAnnotation + "/pod": `not a list`}, false},
	} {
		if got := requiresPlugin(pod{Annotations: tc.annotations}); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.annotations, got, tc.want)
		}
	}
}
