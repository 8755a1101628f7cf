package podnet

import (
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
				Network: networkData(d), Message: "interface " + d.Interface + " configured in the pod"}})
		}
	}
	p.report(devs)
}

// failed queues not-Ready status, with the reason, for the claims of a
// pod whose VFs could not be set up.
func (p *Plugin) failed(atts []attachment, err error) {
	devs := make([]claimDevice, 0, len(atts))
	for _, a := range atts {
		devs = append(devs, claimDevice{a.Claim, metadata.DeviceStatus{Pool: a.VF.Pool, Device: a.VF.Device, ShareID: a.VF.ShareID, Failed: true, Message: err.Error()}})
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
