// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/mock/profile"
	"github.com/hwdra/hwdra/internal/tools/allocate"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// Attributes the metadata adds to what a device publishes: what exists
// only once it is prepared. Anything else unpublished (a capacity's
// name, say) fails the test.
var runtimeAttributes = map[string][]string{
	device.GPUDriver: {device.AttrUUID, metadata.AttrGPUInstanceID, metadata.AttrComputeInstanceID, metadata.AttrMdevUUID,
		metadata.AttrVMMdevUUID, metadata.AttrMdevParent, metadata.AttrParentPCIBusID, metadata.AttrMPSThreadPercentage, metadata.AttrMPSMemoryLimitMiB},
	device.NICDriver: {string(device.NICAttrMode), string(device.NICAttrPFPCIAddress), string(device.NICAttrPFName), pciBusID,
		string(device.NICAttrVFIndex), string(device.NICAttrVFDeviceID), string(device.NICAttrVFDriver), metadata.AttrMaxTxRate,
		metadata.AttrMinTxRate, metadata.AttrMAC, metadata.AttrVLAN, metadata.AttrVLANQoS, metadata.AttrRDMADevice},
}

const pciBusID = "resource.kubernetes.io/pciBusID"

// TestMetadataOfEveryKind: on every built-in mock profile, and in the
// modes configuration or the profile chooses (NICs exclusive, vGPUs one
// type per GPU), one claim per kind of device the agent publishes
// (driver, type, profile or vGPU type, NIC mode) is prepared through the
// kubelet's gRPC API. The metadata file the kubelet plugin library
// writes decodes with the upstream decoder and passes its validation in
// both versions (v1beta1, v1alpha1: at most 32 attributes, each one value
// of a valid form), and holds exactly the device's published attributes,
// same values, plus attributes that exist only once prepared; never a
// capacity's name. A share's limits are in it as enforced: a GPU share's
// MPS limits, a VF share's transmit rate.
func TestMetadataOfEveryKind(t *testing.T) {
	// Short names: the subtest's name is in the temp dir, which holds the
	// plugin's unix socket (108 bytes at most).
	type mode struct{ name, hardware, config string }
	var modes []mode
	for _, name := range profile.Builtins() {
		modes = append(modes, mode{name, "mock:" + name, ""})
	}
	exclusive := "apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\nnics:\n- mode: exclusive\n"
	modes = append(modes,
		mode{"cx7-vf", "mock:cx7", exclusive},                                                 // exclusive VFs
		mode{"a100-vf", "mock:dgx-a100", exclusive},                                           // exclusive VFs, InfiniBand
		mode{"vgpu-1", "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu}]", ""}, // one vGPU type per GPU, mdev
		mode{"vfio-1", "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuFramework: vfio}]", ""},
		mode{"b200", "gpus: [{model: b200-180gb, count: 1}]", ""},
	)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			opts := Options{Hardware: m.hardware}
			if !strings.HasPrefix(m.hardware, "mock:") {
				opts.Hardware = "mock:" + writeProfile(t, m.hardware)
			}
			if m.config != "" {
				opts.ConfigPath = filepath.Join(t.TempDir(), "config.yaml")
				if err := os.WriteFile(opts.ConfigPath, []byte(m.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			a := startAgentWith(t, opts)
			kinds := 0
			for _, driver := range []string{device.GPUDriver, device.NICDriver} {
				if !a.serves(driver) {
					continue
				}
				kinds += checkKinds(t, a, driver)
			}
			if kinds == 0 {
				t.Fatal("no device kind checked")
			}
		})
	}
}

// serves: the agent publishes for driver (once it has published
// something and settled).
func (a *testAgent) serves(driver string) bool {
	a.t.Helper()
	waitfor.True(a.t, "the agent's metrics", 30*time.Second, func() bool { code, _ := probe(a.t, a.opts.MetricsAddress, "/metrics"); return code == 200 })
	waitfor.True(a.t, "the agent's first publication", 30*time.Second, func() bool { return a.publications() > 0 })
	a.settle()
	list, err := a.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		a.t.Fatal(err)
	}
	return slices.ContainsFunc(list.Items, func(s resourceapi.ResourceSlice) bool { return s.Spec.Driver == driver })
}

// checkKinds prepares one device of each kind of the driver's and checks
// its metadata; it returns how many kinds it checked.
func checkKinds(t *testing.T, a *testAgent, driver string) int {
	ss := a.slices(driver, nil)
	capacities := map[string]bool{}
	byKind := map[string]resourceapi.Device{}
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			for name := range d.Capacity {
				capacities[string(name)] = true
			}
			k := kindOf(driver, d)
			if _, ok := byKind[k]; !ok {
				byKind[k] = d
			}
		}
	}
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range slices.Sorted(maps.Keys(byKind)) {
		d := byKind[k]
		c := allocateDevice(t, a, ss, classes, fmt.Sprintf("%s-%d", strings.Split(driver, ".")[0], i), d)
		res := c.Status.Allocation.Devices.Results[0]
		prepareClaims(t, a, driver, c)
		attrs := readMetadata(t, a, driver, c, res)
		published := publishedDevice(t, ss, res.Device)
		t.Logf("%s: %s, %d attributes", k, res.Device, len(attrs))
		checkAttributes(t, driver, k, published, attrs, capacities)
		checkShareFigures(t, k, res, attrs)
		unprepareClaim(t, a, driver, c)
	}
	return len(byKind)
}

// kindOf names a device's kind: its driver, type and profile (GPUs; a
// vGPU's type is its profile), its mode (NICs).
func kindOf(driver string, d resourceapi.Device) string {
	str := func(name resourceapi.QualifiedName) string {
		if v := d.Attributes[name].StringValue; v != nil {
			return *v
		}
		return ""
	}
	if driver == device.GPUDriver {
		return driver + " " + str(device.AttrType) + " " + str(device.AttrProfile)
	}
	return driver + " " + str(device.NICAttrMode)
}

// allocateDevice allocates a claim for a device of d's kind and
// attributes, with the class that takes it (the scheduler's allocator,
// each attribute pinned by CEL), and stores it in the API as allocated.
func allocateDevice(t *testing.T, a *testAgent, ss []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass, name string, d resourceapi.Device) *resourceapi.ResourceClaim {
	t.Helper()
	var terms []string
	for n, v := range d.Attributes {
		domain, id, _ := strings.Cut(string(n), "/")
		ref := fmt.Sprintf("device.attributes[%q].%s", domain, id)
		switch {
		case v.StringValue != nil:
			terms = append(terms, fmt.Sprintf("%s == %q", ref, *v.StringValue))
		case v.IntValue != nil:
			terms = append(terms, fmt.Sprintf("%s == %d", ref, *v.IntValue))
		case v.BoolValue != nil:
			terms = append(terms, fmt.Sprintf("%s == %v", ref, *v.BoolValue))
		}
	}
	sort.Strings(terms)
	alloc := allocate.New(allocate.ClusterFeatures, node, ss, classes)
	var errs []string
	for _, class := range classes {
		c := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "dev", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class.Name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
					Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: strings.Join(terms, " && ")}}}},
			}}}},
		}
		if err := alloc.Allocate(context.Background(), c); err != nil {
			errs = append(errs, class.Name+": "+err.Error())
			continue
		}
		if _, err := a.client.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Fatalf("no class allocates a device like %s: %v", d.Name, errs)
	return nil
}

// readMetadata reads the metadata file of a claim's request, decodes each
// version with the upstream decoder and validation (decodeAll), and
// returns the device's attributes as v1beta1 has them; v1alpha1 must
// hold the same.
func readMetadata(t *testing.T, a *testAgent, driver string, c *resourceapi.ResourceClaim, res resourceapi.DeviceRequestAllocationResult) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(a.dir, "plugins", driver, "dra-device-metadata", c.Namespace+"_"+c.Name, res.Request, "metadata.json"))
	if err != nil {
		t.Fatal(err)
	}
	versions, docs := decodeAll(t, data)
	if strings.Join(versions, " ") != "metadata.resource.k8s.io/v1beta1 metadata.resource.k8s.io/v1alpha1" {
		t.Fatalf("metadata versions %v", versions)
	}
	var found []map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	for _, doc := range docs {
		for _, r := range doc.Requests {
			for _, d := range r.Devices {
				if d.Driver == driver && d.Pool == res.Pool && d.Name == res.Device {
					found = append(found, d.Attributes)
				}
			}
		}
	}
	if len(found) != 2 || !equality.Semantic.DeepEqual(found[0], found[1]) {
		t.Fatalf("device %s in the metadata's two versions: %v", res.Device, found)
	}
	return found[0]
}

func publishedDevice(t *testing.T, ss []*resourceapi.ResourceSlice, name string) resourceapi.Device {
	t.Helper()
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			if d.Name == name {
				return d
			}
		}
	}
	t.Fatalf("device %s is not published", name)
	return resourceapi.Device{}
}

// checkAttributes: every published attribute, same value, except those
// the metadata states for the prepared function instead (a VF's or a
// VFIO-framework vGPU's PCI address, a MIG instance's own UUID); the rest
// are runtime attributes, never a capacity's name.
func checkAttributes(t *testing.T, driver, kind string, published resourceapi.Device, attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, capacities map[string]bool) {
	t.Helper()
	for name, want := range published.Attributes {
		got, ok := attrs[name]
		switch {
		case !ok:
			t.Errorf("%s: published attribute %s is not in the metadata", kind, name)
		case equality.Semantic.DeepEqual(got, want):
		case name == pciBusID && (driver == device.NICDriver || attrs[metadata.AttrParentPCIBusID].StringValue != nil):
			// The VF's address: the function the workload opens.
		case name == device.AttrUUID && attrs[metadata.AttrGPUInstanceID].IntValue != nil:
			// A MIG device's own UUID.
		default:
			t.Errorf("%s: metadata %s = %v, the slice publishes %v", kind, name, got, want)
		}
	}
	for name := range attrs {
		if capacities[string(name)] {
			t.Errorf("%s: the metadata carries %s, a capacity's name: device metadata holds attributes, not capacities", kind, name)
		}
		if _, ok := published.Attributes[name]; !ok && !slices.Contains(runtimeAttributes[driver], string(name)) {
			t.Errorf("%s: the metadata carries %s, neither published nor a documented runtime attribute", kind, name)
		}
	}
}

// checkShareFigures: a share's metadata says what it is held to, in the
// enforcement's units: MPS's thread percentage and memory (MiB), a VF's
// transmit rate (Mb/s), each equal to what the scheduler counted; an
// InfiniBand VF, which takes no rate limit, has none.
func checkShareFigures(t *testing.T, kind string, res resourceapi.DeviceRequestAllocationResult, attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) {
	t.Helper()
	intOf := func(name string) int64 {
		if v := attrs[resourceapi.QualifiedName(name)].IntValue; v != nil {
			return *v
		}
		return -1
	}
	switch {
	case strings.HasSuffix(kind, " share share"):
		compute, memory := res.ConsumedCapacity[device.GPUCapCompute], res.ConsumedCapacity[device.GPUCapMemory]
		if got := intOf(metadata.AttrMPSThreadPercentage); got != compute.Value() {
			t.Errorf("%s: %s %d, the share consumed %s", kind, metadata.AttrMPSThreadPercentage, got, compute.String())
		}
		if got := intOf(metadata.AttrMPSMemoryLimitMiB); got != memory.Value()>>20 {
			t.Errorf("%s: %s %d, the share consumed %s", kind, metadata.AttrMPSMemoryLimitMiB, got, memory.String())
		}
	case strings.HasSuffix(kind, " shared"):
		bw := res.ConsumedCapacity[device.NICCapBandwidth]
		want := bw.Value() / 1e6
		if link := attrs[device.NICAttrLinkType].StringValue; link != nil && *link == "infiniband" {
			want = -1 // InfiniBand VFs take no rate limit: nothing holds the share
		}
		if got := intOf(metadata.AttrMaxTxRate); got != want {
			t.Errorf("%s: %s %d, the share consumed %s (-1: none)", kind, metadata.AttrMaxTxRate, got, bw.String())
		}
	}
}

func unprepareClaim(t *testing.T, a *testAgent, driver string, c *resourceapi.ResourceClaim) {
	t.Helper()
	dra := drapb.NewDRAPluginClient(a.dial(a.socket(driver)))
	resp, err := dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil || resp.Claims[string(c.UID)].Error != "" {
		t.Fatalf("unprepare %s: %v %+v", c.Name, err, resp)
	}
}
