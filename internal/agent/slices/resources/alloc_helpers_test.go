// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/hwdra/hwdra/internal/tools/allocate"
)

const testNode = "worker-1"

// classes: one DeviceClass per driver, selecting by driver only, so each
// test's request states exactly what it wants.
var testClasses = []*resourceapi.DeviceClass{
	deviceClass(device.GPUDriver), deviceClass(device.NICDriver),
}

func deviceClass(driver string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: driver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driver)},
		}}},
	}
}

// newAllocator is the scheduler's allocator over the given drivers' slices.
func newAllocator(t testing.TB, f structured.Features, byDriver map[string]resourceslice.DriverResources) *allocate.Allocator {
	t.Helper()
	var objs []*resourceapi.ResourceSlice
	for driver, res := range byDriver {
		for _, s := range Objects(driver, testNode, res) {
			objs = append(objs, &s)
		}
	}
	return allocate.New(f, testNode, objs, testClasses)
}

var claimSeq int

func claim(reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	claimSeq++
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", claimSeq), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%d", claimSeq))},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
	}
}

// request asks for count devices of a driver (its test class) matching a
// CEL expression.
func request(name, driver string, count int64, cel string) resourceapi.DeviceRequest {
	return allocate.Request(name, driver, count, cel)
}

// profile asks for count GPU devices of one partition type.
func profile(name, p string, count int64) resourceapi.DeviceRequest {
	return request(name, device.GPUDriver, count, fmt.Sprintf(`device.attributes["gpu.hwdra.io"].profile == %q`, p))
}

// fits allocates and reports whether it succeeded; other errors fail.
func fits(t testing.TB, a *allocate.Allocator, claims ...*resourceapi.ResourceClaim) bool {
	t.Helper()
	err := a.Allocate(context.Background(), claims...)
	if err != nil && !errors.Is(err, allocate.ErrUnsatisfiable) {
		t.Fatalf("allocate: %v", err)
	}
	return err == nil
}

func allocatedDevices(c *resourceapi.ResourceClaim) []string {
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, r.Device)
	}
	return out
}
