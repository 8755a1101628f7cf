// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcealpha "k8s.io/api/resource/v1alpha3"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/tools/poolstatus"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestPoolStatusAgreesWithTheController: on a mock DGX H100 with three
// 1g.10gb on GPU 0000:1b:00.0 and two 150G shares of the 400G PF
// 0000:18:00.0 (claims allocated by the scheduler's allocator), an XID 79 on
// GPU 0000:43:00.0 (its devices tainted by the agent) and a
// DeviceTaintRule on the PF 0000:40:00.0, the real kube-controller-manager
// answers a ResourcePoolStatusRequest per driver with no validationError
// and no partition summary (the GPU slices declare no partition type:
// docs/design.md, "Pool status and partition types"), and a shareable summary with 300G of bandwidth
// consumed. `hwdra pool-status -o json` reports the same number for every
// number both report, and what the controller cannot: 4 more 1g.10gb fit
// on 0000:1b:00.0, nothing on the faulted GPU, 100G left on 0000:18:00.0.
func TestPoolStatusAgreesWithTheController(t *testing.T) {
	r := startHWRig(t, "pool-status", "mock:dgx-h100", nil, gpuDriver, nicDriver)
	n, ctx := r.n, r.ctx
	const gpu, faulted, pf, ruled = "0000:1b:00.0", "0000:43:00.0", "0000:18:00.0", "nic-0000-40-00-0"

	alloc, err := n.Allocator(ctx, gpuDriver, nicDriver)
	if err != nil {
		t.Fatal(err)
	}
	mig := oneDevice("mig", "mig.gpu.hwdra.io",
		`device.attributes["resource.kubernetes.io"].pciBusID == "`+gpu+`" && device.attributes["gpu.hwdra.io"].profile == "1g.10gb"`)
	mig.Spec.Devices.Requests[0].Exactly.Count = 3
	claims := []*resourceapi.ResourceClaim{mig}
	for _, name := range []string{"share-a", "share-b"} {
		c := oneDevice(name, "vf-share.sriov.hwdra.io", `device.attributes["sriov.hwdra.io"].pfPciAddress == "`+pf+`"`)
		c.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
			Requests: map[resourceapi.QualifiedName]resource.Quantity{device.NICCapBandwidth: resource.MustParse("150G")},
		}
		claims = append(claims, c)
	}
	for _, c := range claims {
		stored, err := n.CreateAllocatedClaim(ctx, alloc, r.ns, c)
		if err != nil {
			t.Fatalf("claim %s: %v", c.Name, err)
		}
		t.Logf("claim %s: %v", c.Name, stored.Status.Allocation.Devices.Results)
	}

	hwdraInject(t, r.mockDir, "xid", "--gpu", faulted, "--code", "79")
	waitGPUTaints(t, r, faulted, "XID79")
	rule := &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "pool-status-"},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(nicDriver), Pool: ptr.To(n.Name), Device: ptr.To(ruled)},
			Taint:          resourceapi.DeviceTaint{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
	rule, err = n.Admin.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Admin.ResourceV1().DeviceTaintRules().Delete(context.Background(), rule.Name, metav1.DeleteOptions{})
	})
	for _, d := range []string{gpuDriver, nicDriver} {
		if _, err := n.WaitPoolsComplete(ctx, d, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// The controller reads rules from its own informer: wait until it
	// counts the new one.
	waitfor.True(t, "the pool-status controller counting the DeviceTaintRule", 30*time.Second, func() bool {
		nic := requestPoolStatus(t, n, nicDriver, n.Name)
		return len(nic) == 1 && ptr.Deref(nic[0].UnavailableDevices, -1) == 1
	})

	var controller []resourcealpha.PoolStatus
	for _, d := range []string{gpuDriver, nicDriver} {
		controller = append(controller, requestPoolStatus(t, n, d, n.Name)...)
	}
	if len(controller) != 2 {
		t.Fatalf("controller reported %d pools, want 2: %+v", len(controller), controller)
	}
	for _, p := range controller {
		if p.ValidationError != nil {
			t.Errorf("controller: pool %s/%s: validationError %q", p.Driver, p.PoolName, *p.ValidationError)
		}
		if p.PartitionSummary != nil {
			t.Errorf("controller: pool %s/%s has a partition summary %+v: no slice of ours declares a partition type", p.Driver, p.PoolName, p.PartitionSummary)
		}
	}
	gpuPool, nicPool := controller[0], controller[1]
	if ptr.Deref(gpuPool.AllocatedDevices, -1) != 3 || ptr.Deref(gpuPool.UnavailableDevices, -1) != 22 {
		t.Errorf("controller: GPU pool allocated %v, unavailable %v; want 3 and the faulted GPU's 22", gpuPool.AllocatedDevices, gpuPool.UnavailableDevices)
	}
	if ptr.Deref(nicPool.UnavailableDevices, -1) != 1 {
		t.Errorf("controller: NIC pool unavailable %v, want 1 (the DeviceTaintRule's)", nicPool.UnavailableDevices)
	}
	if got := capacityOf(nicPool.ShareableSummary, device.NICCapBandwidth); got == nil || got.Consumed.Cmp(resource.MustParse("300G")) != 0 {
		t.Errorf("controller: shareable bandwidth %+v, want 300G consumed", got)
	}

	began := time.Now()
	ours := hwdraPoolStatus(t, n, n.Name)
	framework.Timing(t, "pool-status-command", time.Since(began))
	if len(ours.Pools) != len(controller) {
		t.Fatalf("hwdra pool-status reports %d pools, the controller %d", len(ours.Pools), len(controller))
	}
	samePools(t, ours, controller)
	for _, g := range ours.Pools[0].GPUs {
		for _, p := range g.Profiles {
			switch {
			case g.PCIBusID == gpu && p.Profile == "1g.10gb" && (p.Allocated != 3 || p.Allocatable != 4):
				t.Errorf("%s 1g.10gb: allocated %d, allocatable %d; want 3 and 4", gpu, p.Allocated, p.Allocatable)
			case g.PCIBusID == faulted && (p.Allocatable != 0 || p.Unavailable != p.Devices):
				t.Errorf("faulted GPU %s: %s %d of %d devices unavailable, %d more allocatable", faulted, p.Profile, p.Unavailable, p.Devices, p.Allocatable)
			}
		}
	}
	found := false
	for _, d := range ours.Pools[1].SharedDevices {
		if d.Unavailable != (d.Device == ruled) {
			t.Errorf("shared device %s: unavailable %v", d.Device, d.Unavailable)
		}
		if d.PCIAddress != pf {
			continue
		}
		found = true
		for _, c := range d.Capacity {
			if c.Name == string(device.NICCapBandwidth) && (c.Available.Cmp(resource.MustParse("100G")) != 0 || d.Allocations != 2) {
				t.Errorf("PF %s: %d shares, %s bandwidth left; want 2 and 100G", pf, d.Allocations, c.Available)
			}
		}
	}
	if !found {
		t.Errorf("PF %s not among the shared devices", pf)
	}
	table, err := exec.Command(framework.HwdraBinary(t), "pool-status", "--kubeconfig", n.AdminKubeconfig(), "--node", n.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("hwdra pool-status: %v\n%s", err, table)
	}
	t.Logf("hwdra pool-status:\n%s", table)
}

// requestPoolStatus asks kube-controller-manager for the pool status of
// driver's pool (every pool of driver for pool "") and returns its pools
// once it has answered.
func requestPoolStatus(t *testing.T, n *framework.Node, driver, pool string) []resourcealpha.PoolStatus {
	t.Helper()
	ctx := context.Background()
	api := n.Admin.ResourceV1alpha3().ResourcePoolStatusRequests()
	req, err := api.Create(ctx, &resourcealpha.ResourcePoolStatusRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "hwdra-"},
		Spec:       resourcealpha.ResourcePoolStatusRequestSpec{Driver: driver, PoolName: poolName(pool)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ResourcePoolStatusRequest for %s: %v", driver, err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), req.Name, metav1.DeleteOptions{}) })
	began := time.Now()
	var got *resourcealpha.ResourcePoolStatusRequest
	waitfor.NoError(t, "the ResourcePoolStatusRequest for "+driver+" answered", 60*time.Second, func() error {
		var err error
		if got, err = api.Get(ctx, req.Name, metav1.GetOptions{}); err == nil && got.Status == nil {
			err = errors.New("no status yet")
		}
		return err
	})
	framework.Timing(t, "pool-status-request/"+driver, time.Since(began))
	for _, c := range got.Status.Conditions {
		if c.Type != resourcealpha.ResourcePoolStatusRequestConditionComplete || c.Status != metav1.ConditionTrue {
			t.Errorf("%s: condition %s=%s: %s", driver, c.Type, c.Status, c.Message)
		}
	}
	return got.Status.Pools
}

// samePools checks that hwdra pool-status reports, pool by pool, what the
// controller does.
func samePools(t *testing.T, ours poolstatus.Report, controller []resourcealpha.PoolStatus) {
	t.Helper()
	for i, want := range controller {
		got := ours.Pools[i].PoolStatus
		if !equality.Semantic.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			t.Errorf("pool %s/%s:\n  hwdra pool-status %s\n  controller        %s", want.Driver, want.PoolName, g, w)
		}
	}
}

func poolName(pool string) *string {
	if pool == "" {
		return nil
	}
	return &pool
}

// hwdraPoolStatus runs `hwdra pool-status -o json` as the admin, for the
// node (every node for "").
func hwdraPoolStatus(t *testing.T, n *framework.Node, node string) poolstatus.Report {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(framework.HwdraBinary(t), "pool-status", "--kubeconfig", n.AdminKubeconfig(), "--node", node, "-o", "json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hwdra pool-status: %v\n%s", err, stderr.String())
	}
	var r poolstatus.Report
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("hwdra pool-status output: %v\n%s", err, stdout.String())
	}
	return r
}

func capacityOf(s *resourcealpha.ShareableSummaryStatus, name resourceapi.QualifiedName) *resourcealpha.ShareableCapacityStatus {
	if s == nil {
		return nil
	}
	for i := range s.Capacity {
		if s.Capacity[i].Name == string(name) {
			return &s.Capacity[i]
		}
	}
	return nil
}

// TestPoolStatusUserRBAC: a user (a ServiceAccount's token) without a
// binding is refused by `hwdra pool-status`; bound to the chart's
// aggregated ClusterRole hwdra-pool-status (its rules aggregated by the
// controller manager from hwdra-pool-status-rules), the same command
// reports the node's pools, and the user may ask Kubernetes' own counts
// (a ResourcePoolStatusRequest) but write no ResourceSlice.
func TestPoolStatusUserRBAC(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	ns := n.CreateNamespace(t, "pool-reader")
	if _, err := n.Admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "planner"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	creds, err := n.ServiceAccountCredentials(ctx, ns, "planner")
	if err != nil {
		t.Fatal(err)
	}
	run := func() (string, error) {
		out, err := exec.Command(framework.HwdraBinary(t), "pool-status", "--kubeconfig", creds.Kubeconfig, "--node", n.Name).CombinedOutput()
		return string(out), err
	}
	if out, err := run(); err == nil || !strings.Contains(out, "forbidden") {
		t.Fatalf("hwdra pool-status without a binding: %v\n%s", err, out)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-reader-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "hwdra-pool-status"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "planner", Namespace: ns}},
	}
	if _, err := n.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	var out string
	// The aggregation and the authorizer's cache take a moment.
	waitfor.NoError(t, "hwdra pool-status bound to hwdra-pool-status", 30*time.Second, func() error {
		var err error
		if out, err = run(); err != nil {
			return fmt.Errorf("%w\n%s", err, out)
		}
		return nil
	})
	t.Logf("hwdra pool-status as the bound user:\n%s", out)
	req, err := creds.Client.ResourceV1alpha3().ResourcePoolStatusRequests().Create(ctx, &resourcealpha.ResourcePoolStatusRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "planner-"}, Spec: resourcealpha.ResourcePoolStatusRequestSpec{Driver: gpuDriver},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("ResourcePoolStatusRequest as the bound user: %v", err)
	}
	if err := creds.Client.ResourceV1alpha3().ResourcePoolStatusRequests().Delete(ctx, req.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting its ResourcePoolStatusRequest: %v", err)
	}
	if _, err := creds.Client.ResourceV1().ResourceSlices().Create(ctx, slice("planner-"+ns, gpuDriver, n.Name), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Errorf("a ResourceSlice written as the bound user: %v, want forbidden", err)
	}
}
