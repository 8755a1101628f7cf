// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// A VF share's way into its pod: containerd calls the agent's NRI plugin,
// which moves the VF's netdev into the pod's network namespace, writes the
// deferred network metadata and the claim's status.devices.

// vfNet is what a pod's VF should look like.
type vfNet struct {
	name  string // interface name in the pod
	mtu   int
	mac   string // "" for the VF's own
	addrs []string
}

// defaultVF is an unconfigured share on a mock PF (MTU 1500).
var defaultVF = vfNet{name: "net1", mtu: 1500}

// checkInterface checks a running pod's VF of result res, in the
// container's own output: its interface (name, MAC, MTU, addresses, up)
// and its metadata file (at metaPath, every API version) at generation 2
// with networkData saying the same; then the claim's status.devices entry
// of the device, with the same networkData and Ready and NetworkReady
// true. It returns the interface's MAC.
func checkInterface(t *testing.T, n *framework.Node, ctx context.Context, pod string, out framework.AppOutput,
	claim *resourceapi.ResourceClaim, res resourceapi.DeviceRequestAllocationResult, metaPath string, want vfNet) string {
	t.Helper()
	got, ok := out.Interfaces[want.name]
	if !ok {
		t.Errorf("pod %s: no interface %s in the container (it has %v)", pod, want.name, ifaceNames(out.Interfaces))
		return ""
	}
	if !got.Up || got.MTU != want.mtu || (want.mac != "" && got.MAC != want.mac) || !containsAllAddrs(got.Addrs, want.addrs) {
		t.Errorf("pod %s: interface %+v in the container, want %+v, up", pod, got, want)
	}
	data, ok := out.Files[metaPath]
	if !ok {
		t.Errorf("pod %s: no metadata file %s (missing: %v)", pod, metaPath, out.Missing)
		return got.MAC
	}
	docs, err := framework.DecodeMetadata(data)
	if err != nil || len(docs) != 2 {
		t.Fatalf("pod %s: metadata %s: %v, %d documents", pod, metaPath, err, len(docs))
	}
	var ips []string
	for _, d := range docs {
		dev := d.Requests[0].Devices[0]
		nd := dev.NetworkData
		if d.Metadata.Generation != 2 || nd == nil || nd.InterfaceName != want.name || nd.HardwareAddress != got.MAC ||
			!reflect.DeepEqual(nd.IPs, want.addrs) || dev.Name != res.Device {
			t.Errorf("pod %s: metadata %s: generation %d, device %s, networkData %+v; want generation 2 with %s %s %v",
				pod, d.APIVersion, d.Metadata.Generation, dev.Name, nd, want.name, got.MAC, want.addrs)
		}
		if nd != nil {
			ips = nd.IPs
		}
	}
	// The status is written in the background: wait for it.
	var c *resourceapi.ResourceClaim
	if err := waitfor.Until(ctx, "claim "+claim.Name+"'s network status", 20*time.Second, func() bool {
		var err error
		if c, err = n.Admin.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		entry := deviceStatus(c, res)
		return entry != nil && entry.NetworkData != nil && entry.NetworkData.InterfaceName == want.name &&
			entry.NetworkData.HardwareAddress == got.MAC && slices.Equal(entry.NetworkData.IPs, ips) &&
			conditionTrue(entry, "Ready") && conditionTrue(entry, "NetworkReady")
	}); err != nil {
		t.Errorf("%v: status.devices %+v, want %s/%s ready with interface %s %s", err, c.Status.Devices, res.Pool, res.Device, want.name, got.MAC)
	}
	return got.MAC
}

func deviceStatus(c *resourceapi.ResourceClaim, res resourceapi.DeviceRequestAllocationResult) *resourceapi.AllocatedDeviceStatus {
	for i, d := range c.Status.Devices {
		share := ""
		if res.ShareID != nil {
			share = string(*res.ShareID)
		}
		if d.Driver == res.Driver && d.Pool == res.Pool && d.Device == res.Device && (d.ShareID == nil && share == "" || d.ShareID != nil && *d.ShareID == share) {
			return &c.Status.Devices[i]
		}
	}
	return nil
}

func conditionTrue(d *resourceapi.AllocatedDeviceStatus, typ string) bool {
	for _, c := range d.Conditions {
		if c.Type == typ {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

func containsAllAddrs(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func ifaceNames(m map[string]framework.Interface) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// nodeLinks is the node's list of links (the test runs in the node's
// network namespace): name -> MTU, MAC, up. Pods' CNI veths (veth*) are
// left out: they come and go with pods of any scenario; so is the MAC of
// the CNI bridge, which follows its ports.
func nodeLinks(t *testing.T) map[string]string {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range ls {
		a := l.Attrs()
		if strings.HasPrefix(a.Name, "veth") {
			continue
		}
		mac := a.HardwareAddr.String()
		if l.Type() == "bridge" {
			mac = "(bridge)"
		}
		out[a.Name] = fmt.Sprintf("mtu=%d mac=%s up=%t", a.MTU, mac, a.Flags&net.FlagUp != 0)
	}
	return out
}

// waitNodeLinks waits until the node's links are want again: every VF
// back under its original name, with its settings.
func waitNodeLinks(t *testing.T, want map[string]string) {
	t.Helper()
	var got map[string]string
	if waitfor.Until(t.Context(), "the node's links as before the pods", 30*time.Second, func() bool {
		got = nodeLinks(t)
		return reflect.DeepEqual(got, want)
	}) != nil {
		var diff []string
		for k, v := range want {
			if got[k] != v {
				diff = append(diff, fmt.Sprintf("%s: %q, was %q", k, got[k], v))
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok {
				diff = append(diff, fmt.Sprintf("%s: new (%s)", k, v))
			}
		}
		sort.Strings(diff)
		t.Fatalf("the node's links are not as before the pods:\n%s", strings.Join(diff, "\n"))
	}
}

// checkStatusWrites logs the agent's claim status writes (through the real
// API server) and fails unless claims were written once each, with at
// most maxRequests API requests in all.
func checkStatusWrites(t *testing.T, claims, maxRequests int) {
	t.Helper()
	// The agents of pod scenarios serve metrics on the default address.
	ok, err := framework.AgentMetric(framework.AgentAddr, `hwdra_claim_status_writes_total{driver="sriov.hwdra.io",result="success"}`)
	if err != nil {
		t.Fatal(err)
	}
	failed, _ := framework.AgentMetric(framework.AgentAddr, `hwdra_claim_status_writes_total{driver="sriov.hwdra.io",result="refused"}`)
	n, _ := strconv.Atoi(ok)
	f, _ := strconv.Atoi(failed)
	t.Logf("claim status writes: %d written, %d refused (API requests)", n, f)
	if n != claims || n+f > maxRequests {
		t.Errorf("claim status: %d writes and %d refused requests for %d claims, want %d writes in at most %d requests", n, f, claims, claims, maxRequests)
	}
}

// TestPodVFDirectClaim: a pod with a directly referenced ResourceClaim
// whose opaque VfConfig sets the interface's name, MTU, MAC and an address
// runs with that interface (the agent's vfPolicy lets claims choose a MAC
// address); its metadata (under resourceclaims/) and the claim's status
// say the same; deleting the pod and the claim gives the node its links
// back as they were.
func TestPodVFDirectClaim(t *testing.T) {
	s := startScenarioWith(t, "pod-vf-direct", "mock:cx7", map[string]any{"vfPolicy": map[string]any{"allowMAC": true}}, nicDriver)
	before := nodeLinks(t)
	claim := shareClaim(t, "10G")
	claim.Name = "fast-net"
	raw := `{"apiVersion": "sriov.hwdra.io/v1alpha1", "kind": "VfConfig", "interfaceName": "fast0", "mtu": 9000,
		"mac": "02:5a:00:00:00:07", "addresses": ["192.168.50.10/24"]}`
	claim.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"nic"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: nicDriver, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}}
	if _, err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Create(s.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	meta := framework.MetadataPathDirect(claim.Name, "nic", nicDriver)
	pod := framework.PodWithClaim("direct", claim.Name, meta)
	began := time.Now()
	if _, err := s.n.Admin.CoreV1().Pods(s.ns).Create(s.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.n.WaitPodRunning(s.ctx, s.ns, pod.Name, podRunningTimeout); err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "pod-vf-direct-claim", time.Since(began))
	allocated, err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Get(s.ctx, claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs, err := s.n.WaitPodLogs(s.ctx, s.ns, pod.Name, "app", "=== END", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	out := framework.ParseAppOutput(logs)
	want := vfNet{name: "fast0", mtu: 9000, mac: "02:5a:00:00:00:07", addrs: []string{"192.168.50.10/24"}}
	checkInterface(t, s.n, s.ctx, pod.Name, out, allocated, result(t, allocated, "nic"), meta, want)
	if _, ok := out.Interfaces["eth0"]; !ok {
		t.Errorf("the pod lost its CNI interface eth0: %v", ifaceNames(out.Interfaces))
	}
	// The 1.37.2 API server refuses the apply of a claim with opaque
	// config (metadata.StatusWriter): one refused apply, one update.
	checkStatusWrites(t, 1, 2)

	s.deletePod(pod.Name)
	if err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Delete(s.ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNodeLinks(t, before)
}

// TestSharedVFClaimOnePodAtATime: two pods name one ResourceClaim with a
// VF share. The first runs with its interface; the second, which the
// kubelet never asks the agent to prepare (the claim is prepared once),
// does not start without its network: containerd refuses its sandbox with
// the agent's reason, which the kubelet shows as an event on the pod.
// Once the first pod is gone, the second gets the VF and runs with it.
func TestSharedVFClaimOnePodAtATime(t *testing.T) {
	s := startScenario(t, "vf-shared-claim", "mock:cx7", nicDriver)
	claim := shareClaim(t, "10G")
	claim.Name = "shared-net"
	if _, err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Create(s.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	meta := framework.MetadataPathDirect(claim.Name, "nic", nicDriver)
	for _, name := range []string{"first", "second"} {
		if name == "second" {
			if _, err := s.n.WaitPodRunning(s.ctx, s.ns, "first", podRunningTimeout); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.n.Admin.CoreV1().Pods(s.ns).Create(s.ctx, framework.PodWithClaim(name, claim.Name, meta), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	logs, err := s.n.WaitPodLogs(s.ctx, s.ns, "first", "app", "=== END", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := framework.ParseAppOutput(logs).Interfaces["net1"]; !ok {
		t.Fatalf("the first pod has no net1")
	}

	event := s.waitEvent("second", "a claim of its own", 60*time.Second)
	t.Logf("the second pod's event: %s", event)
	if p, err := s.n.Admin.CoreV1().Pods(s.ns).Get(s.ctx, "second", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Fatalf("the second pod runs while the first has the claim's VF (%v)", err)
	}

	s.deletePod("first")
	if _, err := s.n.WaitPodRunning(s.ctx, s.ns, "second", podRunningTimeout); err != nil {
		t.Fatalf("the second pod once the first is gone: %v", err)
	}
	logs, err = s.n.WaitPodLogs(s.ctx, s.ns, "second", "app", "=== END", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := framework.ParseAppOutput(logs).Interfaces["net1"]; !ok {
		t.Errorf("the second pod runs without net1")
	}
}

// waitEvent waits for an event of pod name whose message contains want
// and returns it ("<reason>: <message>").
func (s *scenario) waitEvent(name, want string, timeout time.Duration) string {
	s.t.Helper()
	var found string
	waitfor.NoError(s.t, fmt.Sprintf("an event of pod %s with %q", name, want), timeout, func() error {
		list, err := s.n.Admin.CoreV1().Events(s.ns).List(s.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			s.t.Fatal(err)
		}
		var seen []string
		for _, e := range list.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if strings.Contains(e.Message, want) {
				found = e.Reason + ": " + e.Message
				return nil
			}
		}
		return fmt.Errorf("events: %v", seen)
	})
	return found
}
