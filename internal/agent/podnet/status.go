// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/agent/metadata"
)

// succeeded queues Ready status for the claims with a VF moved into a
// pod (all: every claim of the pod). An apply names all of a claim's
// devices: one it leaves out loses its entry.
func (p *Plugin) succeeded(done []attached, all bool) {
	changed := map[types.UID]bool{}
	for _, d := range done {
		changed[d.Claim.UID] = changed[d.Claim.UID] || d.Moved || all
	}
	var devs []claimDevice
	for _, d := range done {
		if changed[d.Claim.UID] {
			devs = append(devs, claimDevice{d.Claim, metadata.DeviceStatus{Pool: d.VF.Pool, Device: d.VF.Device, ShareID: d.VF.ShareID,
				Network: networkData(d), Conditions: metadata.NetworkConfigured(), Message: "interface " + d.Interface + " configured in the pod"}})
		}
	}
	p.report(devs)
}

// failed queues not-Ready status, with the reason, for the claims of a
// pod whose VFs could not be set up.
func (p *Plugin) failed(atts []attachment, err error) {
	devs := make([]claimDevice, 0, len(atts))
	for _, a := range atts {
		devs = append(devs, claimDevice{a.Claim, metadata.DeviceStatus{Pool: a.VF.Pool, Device: a.VF.Device, ShareID: a.VF.ShareID,
			Conditions: metadata.NetworkFailed(), Message: err.Error()}})
	}
	p.report(devs)
}

// stopping queues NetworkReady False, without networkData, for the
// claims with a VF placed in a pod whose sandbox stops: the interface
// the status named is gone from the pod. The VF stays prepared for the
// claim (Ready). Called before the VFs go back, while the placements
// still say which pod had them; a second stop (RemovePodSandbox) finds
// none and writes nothing.
func (p *Plugin) stopping(pd types.UID) {
	placed := map[string]types.UID{} // VF address -> claim
	for _, addr := range p.ledger.Keys() {
		if pl, ok := p.ledger.Get(addr); ok && pl.Pod == pd {
			placed[addr] = pl.Claim
		}
	}
	if len(placed) == 0 {
		return
	}
	claims := p.prepared.Claims()
	var devs []claimDevice
	for _, uid := range slices.Sorted(maps.Keys(claims)) {
		c := claims[uid]
		for _, vf := range c.Record.VFs {
			if placed[vf.PCIAddress] != uid {
				continue
			}
			devs = append(devs, claimDevice{metadata.ClaimRef{UID: uid, Namespace: c.Namespace, Name: c.Name}, metadata.DeviceStatus{
				Pool: vf.Pool, Device: vf.Device, ShareID: vf.ShareID, Conditions: metadata.NetworkStopped(),
				Message: "the pod's sandbox stopped: VF " + vf.PCIAddress + " is back in the host network namespace, still prepared for the claim"}})
		}
	}
	p.report(devs)
}

type claimDevice struct {
	claim metadata.ClaimRef
	metadata.DeviceStatus
}

// report queues one ClaimStatus per claim, its devices in order.
func (p *Plugin) report(devs []claimDevice) {
	if p.opts.Status == nil {
		return
	}
	now := metav1.Now()
	byClaim := map[types.UID]*metadata.ClaimStatus{}
	var order []types.UID
	for _, d := range devs {
		cs := byClaim[d.claim.UID]
		if cs == nil {
			cs = &metadata.ClaimStatus{Claim: d.claim, Time: now}
			byClaim[d.claim.UID] = cs
			order = append(order, d.claim.UID)
		}
		cs.Devices = append(cs.Devices, d.DeviceStatus)
	}
	for _, uid := range order {
		p.opts.Status.Set(*byClaim[uid])
	}
}
