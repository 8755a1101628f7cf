package gpu

import (
	"fmt"
	"strings"

	"github.com/google/uuid"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/hw"
	"github.com/hwdra/hwdra/nvml"
	"github.com/hwdra/hwdra/prepare"

	"github.com/hwdra/hwdra/slices/device"
)

// applier applies one claim's plan. Before each side effect it makes sure
// that a crash right after it leaves a record to undo it by: a ledger
// entry for what the agent creates (GPU instances, mediated devices, a MIG
// mode switch), which start-up reconciliation undoes unless a prepared
// claim owns it, or, for a compute instance in a static GPU instance (no
// ledger entry), the claim's record saved to the checkpoint. The ledger is
// written without fsync, so a prepare costs one fsync (the final
// checkpoint write). After each side effect the result goes into the
// claim's record.
type applier struct {
	d     *Driver
	claim types.UID
	rec   *Record
	save  func() error
}

func (a *applier) apply(p devicePlan, libs *cdispec.ContainerEdits) (prepare.Device, error) {
	if p.admin {
		out := prepare.Device{Requests: []string{p.request}, Pool: p.pool, Device: p.device}
		var err error
		out.Edits, out.Attributes, err = a.asItIs(p, libs)
		out.Attributes = metadata(p.dev.Attributes, out.Attributes)
		return out, err
	}
	a.rec.Devices = append(a.rec.Devices, DeviceRecord{Request: p.request, Device: p.device, GPU: p.dev.GPU.PCIBusID})
	r := &a.rec.Devices[len(a.rec.Devices)-1]
	a.d.use(r.GPU, a.claim)
	if err := a.migMode(r, p.wantMIG); err != nil {
		return prepare.Device{}, err
	}
	out := prepare.Device{Requests: []string{p.request}, Pool: p.pool, Device: p.device}
	var err error
	switch p.dev.Kind {
	case device.KindGPU:
		out.Edits, out.Attributes, err = a.fullGPU(r, p, libs)
	case device.KindMIG:
		out.Edits, out.Attributes, err = a.mig(r, p, libs)
	case device.KindVGPU:
		out.Edits, out.Attributes, err = a.vgpu(r, p)
	}
	out.Attributes = metadata(p.dev.Attributes, out.Attributes)
	return out, err
}

// metadata is what a container reads about its device (KEP-5304): every
// attribute the ResourceSlice publishes for it, under the same names with
// the same values, plus what exists only once it is prepared (a MIG
// device's UUID, a vGPU's mediated device), in the driver's domain
// ("gpu.hwdra.io/uuid") like the published ones.
func metadata(published map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, runtime map[string]resourceapi.DeviceAttribute) map[string]resourceapi.DeviceAttribute {
	out := make(map[string]resourceapi.DeviceAttribute, len(published)+len(runtime))
	for k, v := range published {
		out[string(k)] = v
	}
	for k, v := range runtime {
		if !strings.Contains(k, "/") {
			k = DriverName + "/" + k
		}
		out[k] = v
	}
	return out
}

// migMode switches the GPU's MIG mode where the device needs the other
// one. The nvml backend refuses where that needs a reset or anything uses
// the GPU. The ledger keeps the mode the GPU had before the agent first
// switched it, for restoring once no claim uses the GPU.
func (a *applier) migMode(r *DeviceRecord, want bool) error {
	on, err := a.d.nvml.MIGEnabled(r.GPU)
	if err != nil || on == want {
		return err
	}
	r.MIGMode = &MIGModeChange{Enabled: want}
	if _, ok := a.d.ledger.Get(migKey(r.GPU)); !ok {
		if err := a.d.ledger.Put(migKey(r.GPU), ledgerEntry{GPU: r.GPU, MIGEnabled: &on}); err != nil {
			return err
		}
	}
	if err := a.d.nvml.SetMIGMode(r.GPU, want); err != nil {
		return err
	}
	return a.d.effect("mig-mode")
}

// asItIs gives an adminAccess request the device as it is, for monitoring
// and debugging beside the claims that use it: the GPU's device nodes and,
// where the MIG partition exists, its capability nodes. Nothing is
// created, switched or counted as use, and nothing is recorded: unprepare
// has nothing to undo.
func (a *applier) asItIs(p devicePlan, libs *cdispec.ContainerEdits) (*cdispec.ContainerEdits, map[string]resourceapi.DeviceAttribute, error) {
	g := p.dev.GPU
	edits, minor, err := a.d.gpuEdits(g.PCIBusID)
	if err != nil {
		return nil, nil, err
	}
	edits.Env = append(edits.Env, envName(p.device, "UUID")+"="+g.UUID)
	attrs := map[string]resourceapi.DeviceAttribute{}
	if p.dev.Kind != device.KindGPU && p.dev.Placement.Size > 0 {
		list, err := a.d.nvml.GPUInstances(g.PCIBusID)
		if err != nil {
			return nil, nil, err
		}
		for _, gi := range list {
			if gi.ProfileID != p.dev.Profile.ID || gi.Placement != p.dev.Placement || len(gi.ComputeInstances) == 0 {
				continue
			}
			ci := gi.ComputeInstances[0]
			caps, err := a.d.nodes.migCaps(minor, gi.ID, ci.ID)
			if err != nil {
				return nil, nil, err
			}
			edits.DeviceNodes = append(edits.DeviceNodes, caps...)
			attrs["gpuInstanceID"], attrs["computeInstanceID"] = integer(gi.ID), integer(ci.ID)
			if ci.UUID != "" {
				attrs["uuid"] = str(ci.UUID)
			}
		}
	}
	return merge(edits, libs), attrs, nil
}

func (a *applier) fullGPU(r *DeviceRecord, p devicePlan, libs *cdispec.ContainerEdits) (*cdispec.ContainerEdits, map[string]resourceapi.DeviceAttribute, error) {
	g := p.dev.GPU
	edits, _, err := a.d.gpuEdits(g.PCIBusID)
	if err != nil {
		return nil, nil, err
	}
	edits.Env = append(edits.Env, envName(p.device, "UUID")+"="+g.UUID)
	return merge(edits, libs), nil, nil
}

func (a *applier) mig(r *DeviceRecord, p devicePlan, libs *cdispec.ContainerEdits) (*cdispec.ContainerEdits, map[string]resourceapi.DeviceAttribute, error) {
	g := p.dev.GPU
	gi, existing, err := a.gpuInstance(r, p)
	if err != nil {
		return nil, nil, err
	}
	ci, err := a.computeInstance(r, p, gi, existing)
	if err != nil {
		return nil, nil, err
	}
	migUUID, err := a.d.nvml.MIGDeviceUUID(g.PCIBusID, gi, ci)
	if err != nil {
		return nil, nil, err
	}
	edits, minor, err := a.d.gpuEdits(g.PCIBusID)
	if err != nil {
		return nil, nil, err
	}
	caps, err := a.d.nodes.migCaps(minor, gi, ci)
	if err != nil {
		return nil, nil, err
	}
	edits.DeviceNodes = append(edits.DeviceNodes, caps...)
	edits.Env = append(edits.Env, envName(p.device, "UUID")+"="+migUUID)
	attrs := map[string]resourceapi.DeviceAttribute{
		"uuid":              str(migUUID),
		"gpuInstanceID":     integer(gi),
		"computeInstanceID": integer(ci),
	}
	return merge(edits, libs), attrs, nil
}

// gpuInstance finds or creates the device's GPU instance. One that exists
// exactly at the placement with the profile is used as it is: a static
// partition (never destroyed by the agent), or one the agent made (its
// ledger says so) that no prepared claim owns. Otherwise it is created.
func (a *applier) gpuInstance(r *DeviceRecord, p devicePlan) (int, []hw.ComputeInstance, error) {
	prof, at := p.dev.Profile, p.dev.Placement
	key := giKey(r.GPU, prof.ID, at)
	list, err := a.d.nvml.GPUInstances(r.GPU)
	if err != nil {
		return 0, nil, err
	}
	for _, gi := range list {
		if gi.ProfileID != prof.ID || gi.Placement != at {
			continue
		}
		if err := a.d.own(key, a.claim); err != nil {
			return 0, nil, err
		}
		_, agentMade := a.d.ledger.Get(key)
		id := gi.ID
		r.GPUInstance = &GPUInstanceRecord{Profile: prof.ID, Placement: at, Created: agentMade, ID: &id}
		return gi.ID, gi.ComputeInstances, nil
	}
	if err := a.d.own(key, a.claim); err != nil {
		return 0, nil, err
	}
	r.GPUInstance = &GPUInstanceRecord{Profile: prof.ID, Placement: at, Created: true}
	if err := a.d.ledger.Put(key, ledgerEntry{GPU: r.GPU, Profile: prof.ID, Placement: &at}); err != nil {
		return 0, nil, err
	}
	id, err := a.d.nvml.CreateGPUInstance(r.GPU, prof.ID, at)
	if err != nil {
		return 0, nil, err
	}
	if err := a.d.effect("gpu-instance"); err != nil {
		return 0, nil, err
	}
	r.GPUInstance.ID = &id
	return id, nil, nil
}

// computeInstance uses an existing compute instance of the wanted size
// (a static partition comes with one) or creates one.
func (a *applier) computeInstance(r *DeviceRecord, p devicePlan, gi int, existing []hw.ComputeInstance) (int, error) {
	want := p.computeSlices
	if want == 0 {
		want = p.dev.Profile.Slices
	}
	var ids []int
	for _, ci := range existing {
		if nvml.ComputeProfileSlices(p.dev.Profile, ci.ProfileID) == want {
			id := ci.ID
			r.ComputeInstance = &ComputeInstanceRecord{GPUInstance: gi, Slices: p.computeSlices, Created: r.GPUInstance.Created, ID: &id}
			return ci.ID, nil
		}
		ids = append(ids, ci.ID)
	}
	r.ComputeInstance = &ComputeInstanceRecord{GPUInstance: gi, Slices: p.computeSlices, Created: true, Existing: ids}
	// In a GPU instance of its own the agent's compute instances go with
	// it, so the GPU instance's intent covers this one: no checkpoint
	// write (an fsync) needed. In a static one the intent must say which
	// compute instances were there before.
	if !r.GPUInstance.Created {
		if err := a.save(); err != nil {
			return 0, err
		}
	}
	id, err := a.d.nvml.CreateComputeInstance(r.GPU, gi, p.computeSlices)
	if err != nil {
		return 0, err
	}
	if err := a.d.effect("compute-instance"); err != nil {
		return 0, err
	}
	r.ComputeInstance.ID = &id
	return id, nil
}

func (a *applier) vgpu(r *DeviceRecord, p devicePlan) (*cdispec.ContainerEdits, map[string]resourceapi.DeviceAttribute, error) {
	g, t := p.dev.GPU, p.dev.VGPUType
	gi := -1
	if t.GPUInstanceProfileID != nil {
		var err error
		if gi, _, err = a.gpuInstance(r, p); err != nil {
			return nil, nil, err
		}
	}
	parent, err := a.d.mdevs.Parent(g.PCIBusID, t.ID)
	if err != nil {
		return nil, nil, err
	}
	id := uuid.NewString()
	r.Mdev = &MdevRecord{UUID: id, Parent: parent, Type: t.ID}
	if err := a.d.own(mdevKey(id), a.claim); err != nil {
		return nil, nil, err
	}
	if err := a.d.ledger.Put(mdevKey(id), ledgerEntry{GPU: g.PCIBusID, Mdev: id}); err != nil {
		return nil, nil, err
	}
	if err := a.d.mdevs.Create(parent, t.ID, id); err != nil {
		return nil, nil, err
	}
	if err := a.d.effect("mdev"); err != nil {
		return nil, nil, err
	}
	if gi >= 0 {
		// Hardware quirk: the vendor driver picks the GPU instance of a
		// MIG-backed vGPU. With another free instance of the profile on
		// the GPU (a static one) it may not be the allocated one.
		got, err := a.d.nvml.VGPUInstanceOf(g.PCIBusID, id)
		if err != nil {
			return nil, nil, err
		}
		if got != gi {
			return nil, nil, fmt.Errorf("the vGPU went to GPU instance %d, not to %d at the allocated placement: another %s instance without a vGPU exists on the GPU",
				got, gi, p.dev.Profile.Name)
		}
	}
	edits, err := a.d.vfioEdits(id)
	if err != nil {
		return nil, nil, err
	}
	edits.Env = append(edits.Env, envName(p.device, "MDEV")+"="+id)
	attrs := map[string]resourceapi.DeviceAttribute{
		"mdevUUID":   str(id),
		"mdevParent": str(parent),
	}
	if gi >= 0 {
		attrs["gpuInstanceID"] = integer(gi)
	}
	return edits, attrs, nil
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func integer(i int) resourceapi.DeviceAttribute {
	v := int64(i)
	return resourceapi.DeviceAttribute{IntValue: &v}
}
