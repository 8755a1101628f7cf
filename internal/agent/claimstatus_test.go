// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
)

func shareRequest(memory, compute string) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: "share", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "share.gpu.hwdra.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			device.GPUCapMemory: resource.MustParse(memory), device.GPUCapCompute: resource.MustParse(compute)}}}}
}

// gpuEntry waits for a claim's gpu.hwdra.io entry in status.devices and
// returns it with its data.
func gpuEntry(t *testing.T, a *testAgent, c *resourceapi.ResourceClaim) (resourceapi.AllocatedDeviceStatus, metadata.GPUData) {
	t.Helper()
	var entry resourceapi.AllocatedDeviceStatus
	waitfor.True(t, c.Name+"'s status.devices entry", 30*time.Second, func() bool {
		got, err := a.client.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range got.Status.Devices {
			if d.Driver == device.GPUDriver {
				entry = d
				return true
			}
		}
		return false
	})

	var data metadata.GPUData
	if entry.Data == nil || json.Unmarshal(entry.Data.Raw, &data) != nil {
		t.Fatalf("%s: entry without data: %+v", c.Name, entry)
	}
	res := c.Status.Allocation.Devices.Results[0]
	if entry.Pool != res.Pool || entry.Device != res.Device || (res.ShareID != nil) != (entry.ShareID != nil) {
		t.Errorf("%s: entry keyed %s/%s share %v, allocated %s/%s share %v", c.Name, entry.Pool, entry.Device, entry.ShareID, res.Pool, res.Device, res.ShareID)
	}
	ready := apimeta.FindStatusCondition(entry.Conditions, metadata.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != metadata.ReasonPrepared || len(entry.Conditions) != 1 {
		t.Errorf("%s: conditions %+v, want Ready True (Prepared) alone", c.Name, entry.Conditions)
	}
	return entry, data
}

// statusWrites counts the fake API server's writes to claims' status
// (not the status authorization check's dry runs, which store nothing).
func statusWrites(a *testAgent) int {
	n := 0
	for _, act := range a.client.Actions() {
		if act.GetResource().Resource != "resourceclaims" || act.GetSubresource() != "status" {
			continue
		}
		switch act := act.(type) {
		case k8stesting.UpdateActionImpl:
			if len(act.UpdateOptions.DryRun) == 0 {
				n++
			}
		case k8stesting.PatchActionImpl:
			if len(act.PatchOptions.DryRun) == 0 {
				n++
			}
		}
	}
	return n
}

// TestClaimStatusGPU: each prepared GPU device gets its claim's
// status.devices entry, Ready, with its data: a MIG device its UUID, its
// GPU's, its instance IDs and profile; a share its limits as MPS takes
// them and the MPS pipe directory in the container. One write per claim,
// counted; a repeated prepare writes nothing.
func TestClaimStatusGPU(t *testing.T) {
	a := startAgent(t, "gpus:\n- model: h100-80gb\n  count: 2\n")
	published := a.slices(device.GPUDriver, nil)
	// Apart: a MIG device and a share never share a GPU.
	mig := a.allocated(published, "mig", migOn("3g.40gb", "0000:1b:00.0", 4))
	req := shareRequest("10Gi", "40")
	req.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: `device.attributes["resource.kubernetes.io"].pciBusID == "0000:43:00.0"`}}}
	share := a.allocated(published, "share", req)
	prepareClaims(t, a, device.GPUDriver, mig, share)

	_, d := gpuEntry(t, a, mig)
	if len(d.UUID) < 4 || d.UUID[:4] != "MIG-" || len(d.ParentUUID) < 4 || d.ParentUUID[:4] != "GPU-" || d.GPUInstanceID == nil || d.ComputeInstanceID == nil ||
		d.Profile != "3g.40gb" || d.Type != "mig" || d.PCIBusID == "" || d.Share != nil || d.MPSPipeDirectory != "" {
		t.Errorf("MIG device's data %+v", d)
	}
	entry, d := gpuEntry(t, a, share)
	if d.Share == nil || d.Share.ActiveThreadPercentage != 40 || d.Share.PinnedMemoryLimitMiB != 10240 || d.Share.Isolation != "Policed" ||
		d.MPSPipeDirectory != "/tmp/nvidia-mps" || d.UUID == "" || d.Type != "share" {
		t.Errorf("share's data %+v", d)
	}
	if entry.ShareID == nil {
		t.Error("the share's entry has no shareID")
	}
	waitfor.True(t, "both writes counted", 30*time.Second, func() bool {
		return a.counter(`hwdra_claim_status_writes_total{driver="gpu.hwdra.io",result="success"}`) == 2
	})

	if n := statusWrites(a); n != 2 {
		t.Errorf("%d status writes for 2 claims, want 2", n)
	}
	// A repeated prepare (the kubelet asks again) writes nothing.
	prepareClaims(t, a, device.GPUDriver, mig, share)
	a.settle()
	if n := statusWrites(a); n != 2 {
		t.Errorf("%d status writes after a repeated prepare, want 2", n)
	}
}

// TestClaimStatusGPURefusedNeverDelaysPrepare: a status write that hangs
// does not hold prepare's answer; one the API server forbids (granular
// authorization) and one for a claim deleted meanwhile are counted as
// refused and gone, and prepare succeeded for all three.
func TestClaimStatusGPURefusedNeverDelaysPrepare(t *testing.T) {
	// The fake API server runs its reactors under its lock: a held write
	// holds every request, which a test must not make meanwhile.
	release, started := make(chan struct{}), make(chan struct{}, 1)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	a := startAgent(t, "gpus:\n- model: h100-80gb\n  count: 3\n", func(c *fake.Clientset) {
		c.PrependReactor("patch", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
			gr := schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}
			switch name := action.(k8stesting.PatchActionImpl).GetName(); name {
			case "slow":
				started <- struct{}{}
				<-release // an API server that does not answer
				return false, nil, nil
			case "forbidden":
				return true, nil, apierrors.NewForbidden(gr, name, errors.New(`changing status.devices requires resource="resourceclaims/driver"`))
			case "deleted":
				return true, nil, apierrors.NewNotFound(gr, name)
			}
			return false, nil, nil
		})
	})
	published := a.slices(device.GPUDriver, nil)
	full := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu.hwdra.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
	slow := a.allocated(published, "slow", full)
	prepared := make(chan struct{})
	go func() {
		defer close(prepared)
		prepareClaims(t, a, device.GPUDriver, slow)
	}()
	select {
	case <-prepared:
	case <-time.After(20 * time.Second):
		t.Fatal("prepare waits for its claim's status write")
	}
	select {
	case <-started: // it was under way while prepare answered, or it is now
	case <-time.After(20 * time.Second):
		t.Fatal("no status write for the prepared claim")
	}

	// The writer is held up by the slow write: release it, then refusals.
	close(release)
	forbidden := a.allocated(published, "forbidden", full)
	deleted := a.allocated(published, "deleted", full)
	prepareClaims(t, a, device.GPUDriver, forbidden, deleted)
	waitfor.True(t, "every write counted", 30*time.Second, func() bool {
		return a.counter(`hwdra_claim_status_writes_total{driver="gpu.hwdra.io",result="success"}`) == 1 &&
			a.counter(`hwdra_claim_status_writes_total{driver="gpu.hwdra.io",result="refused"}`) == 1 &&
			a.counter(`hwdra_claim_status_writes_total{driver="gpu.hwdra.io",result="gone"}`) == 1
	})

}

// TestClaimStatusGPUOff: with gpus.claimStatus Off, a GPU claim's prepare
// writes nothing to the API server.
func TestClaimStatusGPUOff(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ngpus: {claimStatus: \"Off\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startAgentWith(t, Options{Hardware: "mock:" + writeProfile(t, "gpus:\n- model: h100-80gb\n  count: 1\n"), ConfigPath: cfg})
	published := a.slices(device.GPUDriver, nil)
	c := a.allocated(published, "mig", migRequest("1g.10gb"))
	prepareClaims(t, a, device.GPUDriver, c)
	a.settle()
	if n := statusWrites(a); n != 0 {
		t.Errorf("%d status writes with gpus.claimStatus Off", n)
	}
	dra := drapb.NewDRAPluginClient(a.dial(a.socket(device.GPUDriver)))
	if _, err := dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}}); err != nil {
		t.Fatal(err)
	}
}
