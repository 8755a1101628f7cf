// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/backend/vfiopci"
	"github.com/hwdra/hwdra/internal/hw"
)

// Prepare implements prepare.Driver: plan, then apply device by device
// under the locks of the claim's GPUs (in PCI order, so concurrent claims
// never deadlock).
func (d *Driver) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim, save func(Record) error) ([]prepare.Device, Record, error) {
	var rec Record
	plans, err := plan(claim, d.catalog(), d.node, d.leave)
	if err != nil {
		return nil, rec, err
	}
	var libs *cdispec.ContainerEdits
	if d.files != nil {
		libs, _ = d.files.Edits(ctx)
	}
	for _, g := range gpusOf(plans) {
		defer d.gpuLocks.Lock(g)()
	}
	a := &applier{d: d, claim: claim.UID, rec: &rec, save: func() error { return save(rec.clone()) }}
	if err := a.modesAsNeeded(plans); err != nil {
		return nil, rec, err
	}
	if err := a.sharesAsAllowed(plans); err != nil {
		return nil, rec, err
	}
	devices := make([]prepare.Device, 0, len(plans))
	for _, p := range plans {
		dev, err := a.apply(ctx, p, libs)
		if err != nil {
			return nil, rec, fmt.Errorf("request %q, device %s: %w", p.request, p.device, err)
		}
		devices = append(devices, dev)
	}
	if err := a.startClaimMPS(ctx, plans, devices); err != nil {
		return nil, rec, err
	}
	return devices, rec, nil
}

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
	// records is the index in rec.Devices of each applied plan's record
	// (-1: an adminAccess device, not recorded); uuids its GPU's or MIG
	// device's UUID.
	records []int
	uuids   []string
}

func (a *applier) apply(ctx context.Context, p devicePlan, libs *cdispec.ContainerEdits) (prepare.Device, error) {
	if p.admin && p.dev.Kind != device.KindPassthrough {
		a.records, a.uuids = append(a.records, -1), append(a.uuids, "")
		out := prepare.Device{Requests: []string{p.request}, Pool: p.pool, Device: p.device, ShareID: p.shareID}
		edits, md, err := a.asItIs(p, libs)
		md.Published = p.dev.Attributes
		out.Edits, out.Attributes = edits, md.Attributes()
		return out, err
	}
	a.rec.Devices = append(a.rec.Devices, DeviceRecord{Request: p.request, Device: p.device, GPU: p.dev.PCIBusID()})
	a.records, a.uuids = append(a.records, len(a.rec.Devices)-1), append(a.uuids, p.dev.GPU.UUID)
	r := &a.rec.Devices[len(a.rec.Devices)-1]
	a.d.use(r.GPU, a.claim)
	out := prepare.Device{Requests: []string{p.request}, Pool: p.pool, Device: p.device, ShareID: p.shareID}
	if p.dev.Kind == device.KindPassthrough {
		// No NVIDIA driver holds the GPU: nothing to switch or create,
		// for an adminAccess request as for any.
		var err error
		out.Edits, err = a.passthrough(p)
		md := metadata.GPU{Published: p.dev.Attributes}
		out.Attributes = md.Attributes()
		return out, err
	}
	if err := a.migMode(r, p); err != nil {
		return prepare.Device{}, err
	}
	if err := a.share(ctx, r, p); err != nil {
		return prepare.Device{}, err
	}
	var (
		md  metadata.GPU
		err error
	)
	switch {
	case p.dev.Kind == device.KindGPU:
		out.Edits, err = a.fullGPU(p, libs)
	case p.dev.Kind == device.KindShare:
		// A share's container gets the GPU; MPS holds it to its share.
		out.Edits, err = a.fullGPU(p, libs)
		md.Share = &metadata.ShareLimits{ThreadPercentage: p.share.compute, MemoryBytes: p.share.memory}
	case p.dev.Kind == device.KindMIG:
		out.Edits, md, err = a.mig(r, p, libs)
	case p.dev.Kind == device.KindVGPU && p.dev.GPU.VGPU.Framework == hw.VGPUFrameworkVFIO:
		out.Edits, md, err = a.vfVGPU(r, p)
	case p.dev.Kind == device.KindVGPU:
		out.Edits, md, err = a.vgpu(r, p)
	}
	if md.UUID != "" {
		a.uuids[len(a.uuids)-1] = md.UUID
	}
	md.Published = p.dev.Attributes
	out.Attributes = md.Attributes()
	return out, err
}

// migMode switches the GPU's MIG mode where the device needs the other
// one. The nvml backend refuses where that needs a reset or anything uses
// the GPU. The ledger keeps the mode the GPU had before the agent first
// switched it, for restoring once no claim uses the GPU. Under
// gpus.settings Leave it never switches (modesAsNeeded refused such a
// claim before anything was applied; this holds it should the mode have
// changed since).
func (a *applier) migMode(r *DeviceRecord, p devicePlan) error {
	want := p.wantMIG
	on, err := a.d.nvml.MIGEnabled(r.GPU)
	if err != nil || on == want {
		return err
	}
	if a.d.leave {
		return leftMIGMode(p, on)
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

// modesAsNeeded checks, under gpus.settings Leave and before anything is
// applied, that every device's GPU is in the MIG mode the device needs:
// the agent switches none, so a claim allocated before the setting
// changed (a MIG partition of a GPU with MIG off, a whole GPU now in MIG
// mode) is refused with nothing made or changed. It reads the live
// hardware under the GPUs' locks: the catalog shows a mode the agent
// switched under Manage as it was, while the claim holding it runs.
func (a *applier) modesAsNeeded(plans []devicePlan) error {
	if !a.d.leave {
		return nil
	}
	for _, p := range plans {
		if p.admin || p.dev.Kind == device.KindPassthrough {
			continue // given as they are: nothing to switch
		}
		on, err := a.d.nvml.MIGEnabled(p.dev.PCIBusID())
		if err != nil {
			return fmt.Errorf("request %q, device %s: %w", p.request, p.device, err)
		}
		if on != p.wantMIG {
			return fmt.Errorf("request %q, device %s: %w", p.request, p.device, leftMIGMode(p, on))
		}
	}
	return nil
}

// leftMIGMode is the refusal of a device whose GPU is not in the MIG mode
// it needs, under gpus.settings Leave: which mode, which setting, and
// what to do.
func leftMIGMode(p devicePlan, on bool) error {
	return fmt.Errorf("needs MIG mode %s on GPU %s, which has it %s, and the agent's configuration says gpus.settings: Leave, so it switches no MIG mode "+
		"(the claim was allocated while it managed them, or the mode changed since): set the GPU's MIG mode with the tool that owns it, delete the claim, or configure the agent with gpus.settings: Manage",
		onOff(p.wantMIG), p.dev.PCIBusID(), onOff(on))
}

// asItIs gives an adminAccess request the device as it is, for monitoring
// and debugging beside the claims that use it: the GPU's device nodes and,
// where the MIG partition exists, its capability nodes. Nothing is
// created, switched or counted as use, and nothing is recorded: unprepare
// has nothing to undo.
func (a *applier) asItIs(p devicePlan, libs *cdispec.ContainerEdits) (*cdispec.ContainerEdits, metadata.GPU, error) {
	g := p.dev.GPU
	var md metadata.GPU
	edits, minor, err := a.d.gpuEdits(g.PCIBusID)
	if err != nil {
		return nil, md, err
	}
	edits.Env = append(edits.Env, envName(p.device, "UUID")+"="+g.UUID)
	if p.dev.Kind != device.KindGPU && p.dev.Placement.Size > 0 {
		list, err := a.d.nvml.GPUInstances(g.PCIBusID)
		if err != nil {
			return nil, md, err
		}
		for _, gi := range list {
			if gi.ProfileID != p.dev.Profile.ID || gi.Placement != p.dev.Placement || len(gi.ComputeInstances) == 0 {
				continue
			}
			ci := gi.ComputeInstances[0]
			caps, err := a.d.nodes.migCaps(minor, gi.ID, ci.ID)
			if err != nil {
				return nil, md, err
			}
			edits.DeviceNodes = append(edits.DeviceNodes, caps...)
			md = metadata.GPU{UUID: ci.UUID, GPUInstance: &gi.ID, ComputeInstance: &ci.ID}
		}
	}
	return merge(edits, libs), md, nil
}

func (a *applier) fullGPU(p devicePlan, libs *cdispec.ContainerEdits) (*cdispec.ContainerEdits, error) {
	g := p.dev.GPU
	edits, _, err := a.d.gpuEdits(g.PCIBusID)
	if err != nil {
		return nil, err
	}
	edits.Env = append(edits.Env, envName(p.device, "UUID")+"="+g.UUID)
	return merge(edits, libs), nil
}

func (a *applier) mig(r *DeviceRecord, p devicePlan, libs *cdispec.ContainerEdits) (*cdispec.ContainerEdits, metadata.GPU, error) {
	g := p.dev.GPU
	gi, existing, err := a.gpuInstance(r, p)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	ci, err := a.computeInstance(r, p, gi, existing)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	migUUID, err := a.d.nvml.MIGDeviceUUID(g.PCIBusID, gi, ci)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	edits, minor, err := a.d.gpuEdits(g.PCIBusID)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	caps, err := a.d.nodes.migCaps(minor, gi, ci)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	edits.DeviceNodes = append(edits.DeviceNodes, caps...)
	edits.Env = append(edits.Env, envName(p.device, "UUID")+"="+migUUID)
	return merge(edits, libs), metadata.GPU{UUID: migUUID, GPUInstance: &gi, ComputeInstance: &ci}, nil
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

func (a *applier) vgpu(r *DeviceRecord, p devicePlan) (*cdispec.ContainerEdits, metadata.GPU, error) {
	g, t := p.dev.GPU, p.dev.VGPUType
	gi := -1
	if t.GPUInstanceProfileID != nil {
		var err error
		if gi, _, err = a.gpuInstance(r, p); err != nil {
			return nil, metadata.GPU{}, err
		}
	}
	parent, err := a.d.mdevs.Parent(g.PCIBusID, t.ID)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	id := uuid.NewString()
	r.Mdev = &MdevRecord{UUID: id, Parent: parent, Type: t.ID}
	if err := a.d.own(mdevKey(id), a.claim); err != nil {
		return nil, metadata.GPU{}, err
	}
	if err := a.d.ledger.Put(mdevKey(id), ledgerEntry{GPU: g.PCIBusID, Mdev: id}); err != nil {
		return nil, metadata.GPU{}, err
	}
	if err := a.d.mdevs.Create(parent, t.ID, id); err != nil {
		return nil, metadata.GPU{}, err
	}
	if err := a.d.effect("mdev"); err != nil {
		return nil, metadata.GPU{}, err
	}
	if gi >= 0 {
		// Hardware quirk: the vendor driver picks the GPU instance of a
		// MIG-backed vGPU. With another free instance of the profile on
		// the GPU (a static one) it may not be the allocated one.
		got, err := a.d.nvml.VGPUInstanceOf(g.PCIBusID, id)
		if err != nil {
			return nil, metadata.GPU{}, err
		}
		if got != gi {
			return nil, metadata.GPU{}, fmt.Errorf("the vGPU went to GPU instance %d, not to %d at the allocated placement: another %s instance without a vGPU exists on the GPU",
				got, gi, p.dev.Profile.Name)
		}
	}
	group, err := a.d.mdevs.IOMMUGroup(id)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	edits, err := a.d.vfioEdits("vGPU "+id, group)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	edits.Env = append(edits.Env, envName(p.device, "MDEV")+"="+id)
	md := metadata.GPU{MdevUUID: id, MdevParent: parent}
	if gi >= 0 {
		md.GPUInstance = &gi
	}
	return edits, md, nil
}

// vfVGPU makes a free VF of the GPU a vGPU of the device's type through
// the vendor-specific VFIO framework (nvml.VFVGPUs), after the GPU
// instance of a MIG-backed type. The VF and type go into the ledger
// before the write, so that a crash right after it leaves the VF to be
// cleared at start unless a prepared claim holds it.
func (a *applier) vfVGPU(r *DeviceRecord, p devicePlan) (*cdispec.ContainerEdits, metadata.GPU, error) {
	g, t := p.dev.GPU, p.dev.VGPUType
	gi := -1
	var hosting map[int]bool
	if t.GPUInstanceProfileID != nil {
		var err error
		if gi, _, err = a.gpuInstance(r, p); err != nil {
			return nil, metadata.GPU{}, err
		}
		if hosting, err = a.d.nvml.GPUInstancesWithVGPUs(g.PCIBusID); err != nil {
			return nil, metadata.GPU{}, err
		}
	}
	vf, err := a.d.vfs.Free(g.PCIBusID, t.ID)
	if err != nil {
		return nil, metadata.GPU{}, fmt.Errorf("vGPU type %s: %w", t.Name, err)
	}
	if err := a.d.vfNoIOMMU(vf); err != nil {
		return nil, metadata.GPU{}, err
	}
	r.VF = &VFRecord{Address: vf, Type: t.ID}
	if err := a.d.own(vfKey(vf), a.claim); err != nil {
		return nil, metadata.GPU{}, err
	}
	if err := a.d.ledger.Put(vfKey(vf), ledgerEntry{GPU: g.PCIBusID, VF: vf, VFType: t.ID}); err != nil {
		return nil, metadata.GPU{}, err
	}
	if err := a.d.vfs.Assign(vf, t.ID); err != nil {
		return nil, metadata.GPU{}, fmt.Errorf("vGPU type %s: %w", t.Name, err)
	}
	if err := a.d.effect("vf-vgpu"); err != nil {
		return nil, metadata.GPU{}, err
	}
	if gi >= 0 {
		// Hardware quirk: the driver picks the GPU instance of a
		// MIG-backed vGPU, and a VF's vGPU has no mdev UUID to ask NVML
		// about: the instance that hosts a vGPU now and did not before
		// is the one it took.
		now, err := a.d.nvml.GPUInstancesWithVGPUs(g.PCIBusID)
		if err != nil {
			return nil, metadata.GPU{}, err
		}
		for id := range now {
			if !hosting[id] && id != gi {
				return nil, metadata.GPU{}, fmt.Errorf("VF %s: the vGPU went to GPU instance %d, not to %d at the allocated placement: another %s instance without a vGPU exists on the GPU",
					vf, id, gi, p.dev.Profile.Name)
			}
		}
	}
	group, err := a.d.vfs.IOMMUGroup(vf)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	if err := vfiopci.GroupViable(a.d.sysfs, group); err != nil {
		return nil, metadata.GPU{}, fmt.Errorf("VF %s: %w", vf, err)
	}
	edits, err := a.d.vfioEdits("VF "+vf+" of GPU "+g.PCIBusID, group)
	if err != nil {
		return nil, metadata.GPU{}, err
	}
	edits.Env = append(edits.Env, envName(p.device, "PCI")+"="+vf)
	md := metadata.GPU{VF: vf}
	if gi >= 0 {
		md.GPUInstance = &gi
	}
	return edits, md, nil
}

// vfNoIOMMU refuses a VF whose VFIO group already shows that it has no
// IOMMU behind it, before the VF is made a vGPU (vfioEdits checks again
// once it is one, where the group appears only then).
func (d *Driver) vfNoIOMMU(vf string) error {
	group, err := d.vfs.IOMMUGroup(vf)
	if err != nil {
		return nil //nolint:nilerr // no group yet: checked once the VF is a vGPU
	}
	g, err := vfiopci.VFIOGroup(d.sysfs, group)
	if err != nil {
		return nil //nolint:nilerr // no VFIO device yet: checked once the VF is a vGPU
	}
	return vfiopci.RefuseNoIOMMU("VF "+vf, g, d.noIOMMU)
}

// passthrough gives a GPU bound to vfio-pci to the container: its VFIO
// group node and /dev/vfio/vfio, once the group is viable (every device
// in it on a VFIO driver), with its PCI address in the environment.
func (a *applier) passthrough(p devicePlan) (*cdispec.ContainerEdits, error) {
	g := p.dev.Passthrough
	if err := vfiopci.GroupViable(a.d.sysfs, g.IOMMUGroup); err != nil {
		return nil, fmt.Errorf("GPU %s: %w", g.PCIBusID, err)
	}
	edits, err := a.d.vfioEdits("GPU "+g.PCIBusID, g.IOMMUGroup)
	if err != nil {
		return nil, err
	}
	edits.Env = append(edits.Env, envName(p.device, "PCI")+"="+g.PCIBusID)
	return edits, nil
}

// effect runs the test hook after a side effect.
func (d *Driver) effect(what string) error {
	if d.afterEffect != nil {
		return d.afterEffect(what)
	}
	return nil
}
