// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/hwdra/hwdra/internal/waitfor"
)

const testDriver = "sriov.hwdra.io"

// writeCounter counts a StatusWriter's API requests, those that did not
// succeed, and each result.
type writeCounter struct {
	all, errs atomic.Int32
	mu        sync.Mutex
	results   map[string]int
}

func (c *writeCounter) ObserveStatusWrite(driver, result string) {
	c.all.Add(1)
	if result != WriteSuccess {
		c.errs.Add(1)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.results == nil {
		c.results = map[string]int{}
	}
	c.results[driver+" "+result]++
}

func (c *writeCounter) result(driver, result string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.results[driver+" "+result]
}

func TestApplyConfiguration(t *testing.T) {
	share := types.UID("share-1")
	at := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	cs := ClaimStatus{
		Claim: ClaimRef{UID: "uid-1", Namespace: "ns", Name: "c"},
		Time:  at,
		Devices: []DeviceStatus{
			{Pool: "node", Device: "nic-0000-17-00-0", ShareID: &share, Message: "interface net1 configured in the pod", Conditions: NetworkConfigured(),
				Network: &resourceapi.NetworkDeviceData{InterfaceName: "net1", IPs: []string{"10.0.0.5/24"}, HardwareAddress: "02:00:00:00:00:01"}},
			{Pool: "node", Device: "nic-0000-17-00-0-vf-3", Conditions: NetworkFailed(), Message: "boom"},
		},
	}
	raw, err := json.Marshal(ApplyConfiguration(testDriver, cs))
	if err != nil {
		t.Fatal(err)
	}
	var got resourceapi.ResourceClaim
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if got.Kind != "ResourceClaim" || got.APIVersion != "resource.k8s.io/v1" || got.Name != "c" || got.Namespace != "ns" || got.UID != "uid-1" {
		t.Errorf("object %s %s %s/%s uid %s", got.APIVersion, got.Kind, got.Namespace, got.Name, got.UID)
	}
	if len(got.Status.Devices) != 2 || got.Spec.Devices.Requests != nil || got.Status.Allocation != nil {
		t.Fatalf("apply carries more or less than status.devices: %s", raw)
	}
	ok, bad := got.Status.Devices[0], got.Status.Devices[1]
	if ok.Driver != testDriver || ok.Pool != "node" || ok.Device != "nic-0000-17-00-0" || ok.ShareID == nil || *ok.ShareID != "share-1" {
		t.Errorf("keys of the ready entry: %+v", ok)
	}
	if bad.ShareID != nil || bad.NetworkData != nil {
		t.Errorf("the failed entry: %+v", bad)
	}
	if n := ok.NetworkData; n == nil || n.InterfaceName != "net1" || len(n.IPs) != 1 || n.IPs[0] != "10.0.0.5/24" || n.HardwareAddress != "02:00:00:00:00:01" {
		t.Errorf("networkData %+v", ok.NetworkData)
	}
	for _, tc := range []struct {
		entry  resourceapi.AllocatedDeviceStatus
		status metav1.ConditionStatus
		reason string
	}{{ok, metav1.ConditionTrue, ReasonConfigured}, {bad, metav1.ConditionFalse, ReasonNetworkSetupFailed}} {
		var types []string
		for _, c := range tc.entry.Conditions {
			types = append(types, c.Type)
			if c.Status != tc.status || c.Reason != tc.reason || c.Message == "" || !c.LastTransitionTime.Equal(&at) {
				t.Errorf("%s condition %+v, want %s %s", tc.entry.Device, c, tc.status, tc.reason)
			}
		}
		if len(types) != 2 || types[0] != ConditionReady || types[1] != ConditionNetworkReady {
			t.Errorf("%s conditions %v", tc.entry.Device, types)
		}
	}
}

// TestStatusWriter: the write is a server-side apply of the status
// subresource with the driver's field manager; other drivers' entries
// survive; a failed write is retried until it succeeds, and the latest
// status wins.
func TestStatusWriter(t *testing.T) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid-1"}}
	client := fake.NewClientset(claim)
	ctx := context.Background()
	other := claim.DeepCopy()
	other.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.example.com", Pool: "node", Device: "gpu-0"}}
	if _, err := client.ResourceV1().ResourceClaims("ns").UpdateStatus(ctx, other, metav1.UpdateOptions{FieldManager: "gpu.example.com"}); err != nil {
		t.Fatal(err)
	}
	var failures atomic.Int32
	failures.Store(3)
	client.PrependReactor("patch", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if name := action.(k8stesting.PatchActionImpl).GetName(); name == "gone" {
			// As the API server answers an apply of a missing object's
			// status (the fake would make the object).
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name)
		}
		if failures.Add(-1) >= 0 {
			return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
		}
		return false, nil, nil
	})
	var writes writeCounter
	w := newStatusWriter(client, testDriver, &writes, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](time.Millisecond, 10*time.Millisecond))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go w.Run(runCtx)

	ref := ClaimRef{UID: "uid-1", Namespace: "ns", Name: "c"}
	w.Set(ClaimStatus{Claim: ref, Time: metav1.Now(), Devices: []DeviceStatus{{Pool: "node", Device: "nic-a", Conditions: NetworkFailed(), Message: "first"}}})
	w.Set(ClaimStatus{Claim: ref, Time: metav1.Now(), Devices: []DeviceStatus{{Pool: "node", Device: "nic-a", Conditions: NetworkConfigured(), Message: "latest",
		Network: &resourceapi.NetworkDeviceData{InterfaceName: "net1"}}}})
	waitfor.True(t, "status written", 10*time.Second, func() bool { return w.Pending() == 0 })
	if writes.errs.Load() != 3 || writes.all.Load() != 4 || writes.result(testDriver, WriteError) != 3 {
		t.Errorf("%d writes, %d failed (%v); want 4 and 3 (three errors, retried, then one write of the latest status)", writes.all.Load(), writes.errs.Load(), writes.results)
	}
	got, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byDriver := map[string]resourceapi.AllocatedDeviceStatus{}
	for _, d := range got.Status.Devices {
		byDriver[d.Driver] = d
	}
	if _, ok := byDriver["gpu.example.com"]; !ok || len(got.Status.Devices) != 2 {
		t.Errorf("another driver's entry did not survive: %+v", got.Status.Devices)
	}
	if d := byDriver[testDriver]; d.Device != "nic-a" || d.NetworkData == nil || d.NetworkData.InterfaceName != "net1" || d.Conditions[0].Message != "latest" {
		t.Errorf("our entry %+v", d)
	}
	var applies int
	for _, a := range client.Actions() {
		p, ok := a.(k8stesting.PatchActionImpl)
		if !ok {
			continue
		}
		applies++
		if p.GetSubresource() != "status" || p.PatchType != types.ApplyPatchType || p.PatchOptions.FieldManager != testDriver ||
			p.PatchOptions.Force == nil || !*p.PatchOptions.Force {
			t.Errorf("write %s/%s %s manager %q force %v, want an apply of status by %s", p.GetResource().Resource, p.GetSubresource(), p.PatchType, p.PatchOptions.FieldManager, p.PatchOptions.Force, testDriver)
		}
	}
	if applies != 4 {
		t.Errorf("%d patches, want 4", applies)
	}

	// A claim that is gone is dropped, not retried: its status stops
	// being pending only where the writer decides not to retry, after
	// its one write.
	before, refused := writes.all.Load(), writes.errs.Load()
	w.Set(ClaimStatus{Claim: ClaimRef{UID: "uid-2", Namespace: "ns", Name: "gone"}, Time: metav1.Now()})
	waitfor.True(t, "gone claim dropped", 10*time.Second, func() bool { return w.Pending() == 0 })
	if n, failed := writes.all.Load()-before, writes.errs.Load()-refused; n != 1 || failed != 1 || writes.result(testDriver, WriteGone) != 1 {
		t.Errorf("%d writes (%d not successful, %v) for a claim that is gone, want 1 gone", n, failed, writes.results)
	}
}

// TestStatusWriterRefusals: a write the API server forbids (granular
// status authorization) or finds invalid for devices no longer allocated
// (the claim deallocated meanwhile) is made once, counted as refused or
// gone, never retried, and said once per kind: the writer goes on with
// the next claim, which is written.
func TestStatusWriterRefusals(t *testing.T) {
	gr := schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}
	client := fake.NewClientset(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "ok", Namespace: "ns", UID: "uid-ok"}})
	client.PrependReactor("patch", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		switch name := action.(k8stesting.PatchActionImpl).GetName(); {
		case strings.HasPrefix(name, "forbidden"):
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name,
				errors.New(`changing status.devices requires resource="resourceclaims/driver"`))
		case name == "deallocated":
			return true, nil, apierrors.NewInvalid(gr, name, field.ErrorList{
				field.Invalid(field.NewPath("status", "devices").Index(0), "gpu.hwdra.io/node/gpu-0", "must be an allocated device in the claim")})
		}
		return false, nil, nil
	})
	var writes writeCounter
	w := newStatusWriter(client, "gpu.hwdra.io", &writes, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](time.Millisecond, 10*time.Millisecond))
	logged := &syncWriter{}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logged)))))
	defer cancel()
	go w.Run(ctx)
	for _, name := range []string{"forbidden-1", "forbidden-2", "deallocated", "ok"} {
		w.Set(ClaimStatus{Claim: ClaimRef{UID: types.UID("uid-" + name), Namespace: "ns", Name: name}, Time: metav1.Now(),
			Devices: []DeviceStatus{{Pool: "node", Device: "gpu-0", Conditions: Prepared(), Data: json.RawMessage(`{"uuid":"GPU-1"}`)}}})
	}
	waitfor.True(t, "every status settled", 10*time.Second, func() bool { return w.Pending() == 0 })
	if f, g, s := writes.result("gpu.hwdra.io", WriteRefused), writes.result("gpu.hwdra.io", WriteGone), writes.result("gpu.hwdra.io", WriteSuccess); f != 2 || g != 1 || s != 1 || writes.all.Load() != 4 {
		t.Errorf("results %v: want 2 refused, 1 gone, 1 success and no retry", writes.results)
	}
	if n := strings.Count(logged.String(), "Claim status forbidden"); n != 1 {
		t.Errorf("the refusal logged %d times at error level, want once:\n%s", n, logged.String())
	}
	got, err := client.ResourceV1().ResourceClaims("ns").Get(context.Background(), "ok", metav1.GetOptions{})
	if err != nil || len(got.Status.Devices) != 1 || got.Status.Devices[0].Data == nil || string(got.Status.Devices[0].Data.Raw) != `{"uuid":"GPU-1"}` ||
		len(got.Status.Devices[0].Conditions) != 1 || got.Status.Devices[0].Conditions[0].Type != ConditionReady {
		t.Errorf("the claim after the refusals: %+v %v", got, err)
	}
}

// syncWriter serialises a test's log output.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStatusWriterWhenApplyDropsAllocation: where the API server refuses
// the apply for a change of status.allocation it does not make (1.37.2
// with opaque config in the allocation), the writer updates the status
// instead: its entries replace the driver's own, other drivers' survive,
// and a conflicting update is retried.
func TestStatusWriterWhenApplyDropsAllocation(t *testing.T) {
	ctx := context.Background()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid-1"}}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{
		{Driver: "gpu.example.com", Pool: "node", Device: "gpu-0"},
		{Driver: testDriver, Pool: "node", Device: "stale"},
	}
	client := fake.NewClientset(claim)
	client.PrependReactor("patch", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}, "c", field.ErrorList{
			field.Invalid(field.NewPath("status", "allocation"), nil, "field cannot be modified once set")})
	})
	var conflicts atomic.Int32
	conflicts.Store(1)
	var manager string
	client.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		manager = a.(k8stesting.UpdateActionImpl).UpdateOptions.FieldManager
		if conflicts.Add(-1) >= 0 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "c", errors.New("changed"))
		}
		return false, nil, nil
	})
	w := newStatusWriter(client, testDriver, nil, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](time.Millisecond, 10*time.Millisecond))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go w.Run(runCtx)
	w.Set(ClaimStatus{Claim: ClaimRef{UID: "uid-1", Namespace: "ns", Name: "c"}, Time: metav1.Now(),
		Devices: []DeviceStatus{{Pool: "node", Device: "nic-a", Network: &resourceapi.NetworkDeviceData{InterfaceName: "net1"}}}})
	waitfor.True(t, "status written", 10*time.Second, func() bool { return w.Pending() == 0 })
	got, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var devices []string
	for _, d := range got.Status.Devices {
		devices = append(devices, d.Driver+"/"+d.Device)
	}
	sort.Strings(devices)
	if strings.Join(devices, " ") != "gpu.example.com/gpu-0 sriov.hwdra.io/nic-a" {
		t.Errorf("status.devices %v: want the other driver's entry and ours, not our stale one", devices)
	}
	if manager != testDriver {
		t.Errorf("update by field manager %q", manager)
	}
}
