// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/backend/sriov"
)

// Placement is a VF netdev the plugin moved (or is moving) into a pod,
// recorded before the move in the placements file, keyed by the VF's PCI
// address: enough to bring it back after a crash, a stop hook that never
// came or a namespace that is gone.
type Placement struct {
	Pod types.UID `json:"pod"`
	// PodRef is "<namespace>/<name>", for messages.
	PodRef string `json:"podRef"`
	// Netns is the pod's network namespace path: containerd may omit it
	// at StopPodSandbox.
	Netns     string    `json:"netns"`
	Claim     types.UID `json:"claim"`
	Interface string    `json:"interface"`
	// Host is the netdev as it was in the host namespace before the move.
	Host sriov.LinkState `json:"host"`
	// RDMA is the VF's RDMA device, moved with it (exclusive mode).
	RDMA   string `json:"rdma,omitempty"`
	BootID string `json:"bootID"`
	// Link is how the kernel knows the netdev in the pod's namespace,
	// read after the move: the VF is found there by it, never by a name
	// the pod can give another link. Added without a new ledger version:
	// an older agent ignores it, and a record without it is found by the
	// link's parent device.
	Link sriov.LinkID `json:"link,omitempty"`
}

// pod is a sandbox as the hooks see it.
type pod struct {
	UID             types.UID
	Namespace, Name string
	Ref             string // namespace/name
	// Netns is its network namespace's path, "" for the host's network.
	Netns       string
	Annotations map[string]string
}

// attached is one VF configured in a pod.
type attached struct {
	attachment
	MAC string // as the pod sees it
	// Moved: this call recorded and moved it (it was not in the pod
	// already); set before the move, so also on a failed one.
	Moved bool
}

// attachAll moves and configures the pod's VFs in order. It returns
// what it configured and the VFs it moved in now (placements it made);
// on error the caller undoes (rollback), and the error names the claim
// and device.
func (p *Plugin) attachAll(ctx context.Context, pd pod, atts []attachment) (done []attached, moved []string, err error) {
	if pd.Netns == "" {
		return nil, nil, fmt.Errorf("pod %s uses the host's network namespace: %s cannot be moved into it (a VF needs a pod network namespace)", pd.Ref, atts[0])
	}
	pns, err := sriov.OpenNetns(pd.Netns)
	if err != nil {
		return nil, nil, fmt.Errorf("pod %s: %w", pd.Ref, err)
	}
	defer pns.Close()
	rdma := p.rdmaExclusive(ctx)
	defer p.settle()
	for _, a := range atts {
		unlock := p.vfs.Lock(a.VF.PCIAddress)
		res, err := p.attach(ctx, pd, pns, a, rdma)
		unlock()
		if res.Moved {
			moved = append(moved, a.VF.PCIAddress)
		}
		if err != nil {
			return done, moved, fmt.Errorf("%s: %w", a, err)
		}
		done = append(done, res)
	}
	return done, moved, nil
}

func (p *Plugin) settle() {
	if p.opts.Sysfs != nil {
		p.opts.Sysfs.Settle()
	}
}

// releaseAll returns the VFs at these addresses, waiting for none.
func (p *Plugin) releaseAll(ctx context.Context, addrs []string) error {
	defer p.settle()
	var errs []error
	for _, addr := range addrs {
		unlock := p.vfs.Lock(addr)
		_, err := p.release(ctx, addr, 0)
		unlock()
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// rdmaExclusive: RDMA devices move with their netdevs only when the
// kernel's RDMA subsystem is in exclusive mode.
func (p *Plugin) rdmaExclusive(ctx context.Context) bool {
	if p.opts.RDMA == nil {
		return false
	}
	ex, err := p.opts.RDMA.Exclusive()
	if err != nil {
		klog.FromContext(ctx).V(2).Info("RDMA netns mode unknown: RDMA devices stay where they are", "err", err)
	}
	return ex
}

// attach moves one VF into the pod and configures it; idempotent. The
// caller holds the VF's lock.
func (p *Plugin) attach(ctx context.Context, pd pod, pns *sriov.Netns, a attachment, rdma bool) (attached, error) {
	addr := a.VF.PCIAddress
	res := attached{attachment: a}
	pl, held := p.ledger.Get(addr)
	if held && (pl.Pod != pd.UID || pl.Netns != pd.Netns) {
		// A stale record (runPod checked that no other pod has the VF):
		// an earlier sandbox of this pod, or a pod whose namespace is
		// gone. Bring the VF home first.
		if _, err := p.release(ctx, addr, 0); err != nil {
			return res, err
		}
		held = false
	}
	index, _, err := p.vfLink(pns, addr, pl.Link)
	if err != nil {
		return res, err
	}
	switch {
	case index == 0:
		hostName, err := p.hostNetdev(addr)
		if err != nil {
			return res, err
		}
		st, err := p.host.ReadLink(hostName)
		if err != nil {
			return res, err
		}
		pl = Placement{Pod: pd.UID, PodRef: pd.Ref, Netns: pd.Netns, Claim: a.Claim.UID, Interface: a.Interface, Host: st, BootID: p.opts.BootID}
		if rdma && a.VF.RDMADevice != "" {
			pl.RDMA = a.VF.RDMADevice
		}
		if err := p.ledger.Put(addr, pl); err != nil {
			return res, err
		}
		res.Moved = true
		if err := p.host.MoveLink(hostName, pns, sriov.LinkSettings{Name: a.Interface, MTU: a.MTU, MAC: a.MAC}); err != nil {
			return res, err
		}
		if pl.RDMA != "" {
			if err := p.opts.RDMA.MoveRDMA(pl.RDMA, p.opts.HostNetns, pd.Netns); err != nil {
				return res, fmt.Errorf("moving RDMA device %s: %w", pl.RDMA, err)
			}
		}
		if index, err = p.moved(pns, addr, a.Interface); err != nil {
			return res, err
		}
	case !held:
		// In the pod with no record (the placements file was lost): take
		// it over with what prepare knew of it.
		pl = Placement{Pod: pd.UID, PodRef: pd.Ref, Netns: pd.Netns, Claim: a.Claim.UID, Interface: a.Interface, BootID: p.opts.BootID,
			Host: sriov.LinkState{Name: a.VF.Netdev, MTU: a.VF.Original.MTU, Up: a.VF.Original.NetdevUp != nil && *a.VF.Original.NetdevUp}}
		klog.FromContext(ctx).Info("VF netdev found in its pod without a record: recorded", "pod", pd.Ref, "vf", addr, "interface", a.Interface)
	}
	if pl.Link == (sriov.LinkID{}) || !held {
		// What identifies the netdev in the pod from now on.
		if pl.Link, err = pns.LinkIDAt(index); err != nil {
			return res, err
		}
		if err := p.ledger.Put(addr, pl); err != nil {
			return res, err
		}
	}
	if err := pns.ConfigureLinkAt(index, a.Addresses, true, a.Routes); err != nil {
		return res, err
	}
	st, err := pns.ReadLinkAt(index)
	if err != nil {
		return res, err
	}
	res.MAC = st.MAC
	return res, nil
}

// moved finds a VF netdev just moved into a pod under name: by identity,
// or, on a kernel that reports no parent device, by the name it was just
// given (the runtime has started no container of the pod yet, or the
// agent moved it now into a pod that lacked it).
func (p *Plugin) moved(pns *sriov.Netns, addr, name string) (int, error) {
	index, _, err := p.vfLink(pns, addr, sriov.LinkID{})
	if err != nil || index != 0 {
		return index, err
	}
	id, err := pns.LinkID(name)
	if err != nil {
		return 0, fmt.Errorf("VF %s after its move: %w", addr, err)
	}
	return id.Index, nil
}

// vfLink finds a VF's netdev in a namespace by identity, never by name
// (a pod with CAP_NET_ADMIN names its links as it likes): the kernel's
// parent device or the link recorded at the move (sriov.Netns.VFLink), or
// where the netdevs are stand-ins without one, Options.Links. It returns
// the link's ifindex and name, 0 and "" when the namespace has none.
func (p *Plugin) vfLink(ns *sriov.Netns, addr string, id sriov.LinkID) (int, string, error) {
	if p.opts.Links != nil {
		return p.opts.Links.VFLink(ns.FD(), addr)
	}
	return ns.VFLink(addr, id)
}

// elsewhere refuses a pod whose VFs another pod has: a VF's netdev is in
// one network namespace, so a claim with a VF serves one pod at a time
// (the others wait: the kubelet retries them). Nothing was done for the
// pod yet.
func (p *Plugin) elsewhere(pd pod, atts []attachment) error {
	for _, a := range atts {
		pl, ok := p.ledger.Get(a.VF.PCIAddress)
		if !ok || pl.Pod == pd.UID || !p.inPod(a.VF.PCIAddress, pl) {
			continue
		}
		return fmt.Errorf("%s is in pod %s: a VF's network interface is in one pod at a time, so a claim with a VF serves one pod at a time "+
			"and this pod waits until that one is gone; give each pod a claim of its own (a ResourceClaimTemplate)", a, pl.PodRef)
	}
	return nil
}

// inPod: the placement's VF is still in its pod's namespace.
func (p *Plugin) inPod(addr string, pl Placement) bool {
	pns, err := sriov.OpenNetns(pl.Netns)
	if err != nil {
		return false
	}
	defer pns.Close()
	index, _, err := p.vfLink(pns, addr, pl.Link)
	return err == nil && index != 0
}

// hostNetdev finds a VF's netdev in the host namespace by identity (a VF
// back from a destroyed namespace has the kernel's name for it, dev<n>
// where its own is taken), else under the name sysfs gives its PCI
// function (kernels that report no parent device).
func (p *Plugin) hostNetdev(addr string) (string, error) {
	if _, name, err := p.vfLink(p.host, addr, sriov.LinkID{}); err != nil || name != "" {
		return name, err
	}
	if _, nd, err := sriov.FunctionState(p.opts.SysfsRoot, addr); err == nil && nd != "" {
		if ok, err := p.host.HasLink(nd); err != nil || ok {
			return nd, err
		}
	}
	return "", fmt.Errorf("the netdev of VF %s is not in %s", addr, p.host)
}

// detachPod returns every VF placed in a pod. wait bounds how long each
// waits for a VF to come back from a destroyed namespace: hooks wait not
// at all (unprepare returns what is still missing).
func (p *Plugin) detachPod(ctx context.Context, uid types.UID, wait time.Duration) error {
	var addrs []string
	for _, addr := range p.ledger.Keys() {
		if pl, ok := p.ledger.Get(addr); ok && pl.Pod == uid {
			addrs = append(addrs, addr)
		}
	}
	sort.Strings(addrs)
	defer p.settle()
	var errs []error
	for _, addr := range addrs {
		unlock := p.vfs.Lock(addr)
		_, err := p.release(ctx, addr, wait)
		unlock()
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Release returns a VF to the host if it is in a pod (nic.PodNetwork),
// waiting up to ReturnWait for one whose namespace is gone.
func (p *Plugin) Release(ctx context.Context, addr string) (string, error) {
	defer p.vfs.Lock(addr)()
	defer p.settle()
	return p.release(ctx, addr, p.opts.ReturnWait)
}

// release moves a placed VF back under its host name and restores its
// MTU, MAC, addresses and state; idempotent. The caller holds its lock.
// It returns the netdev's host name, "" when there was no placement.
func (p *Plugin) release(ctx context.Context, addr string, wait time.Duration) (string, error) {
	pl, ok := p.ledger.Get(addr)
	if !ok {
		return "", nil
	}
	logger := klog.FromContext(ctx)
	back := sriov.LinkSettings{Name: pl.Host.Name, MTU: pl.Host.MTU, MAC: pl.Host.MAC}
	name := ""
	pns, err := sriov.OpenNetns(pl.Netns)
	switch {
	case errors.Is(err, sriov.ErrNetnsGone):
		// The kernel returns a physical VF to the host when its namespace
		// is destroyed (containerd removes it right after StopPodSandbox).
		if _, _, serr := sriov.FunctionState(p.opts.SysfsRoot, addr); errors.Is(serr, fs.ErrNotExist) {
			// The VF itself is gone (its PF's VFs were disabled): its
			// netdev went with it, and so did whatever was to restore.
			logger.Info("VF is gone: nothing to return", "vf", addr, "pod", pl.PodRef)
			return "", p.ledger.Delete(addr)
		}
		if name, err = p.awaitReturn(addr, pl, wait); err != nil {
			return "", err
		}
	case err != nil:
		return "", err
	default:
		defer pns.Close()
		index, inPod, err := p.vfLink(pns, addr, pl.Link)
		if err != nil {
			return "", err
		}
		if index == 0 {
			// Never moved, or back already (a second hook); else whoever
			// holds the pod's namespace moved it on.
			if name, err = p.hostNetdev(addr); err != nil {
				return "", p.missing(ctx, addr, pl, err)
			}
			break
		}
		if pl.RDMA != "" {
			if err := p.opts.RDMA.MoveRDMA(pl.RDMA, pl.Netns, p.opts.HostNetns); err != nil {
				// Not moved yet, or back: the kernel also returns it with
				// the namespace.
				logger.V(2).Info("RDMA device not moved back", "rdma", pl.RDMA, "pod", pl.PodRef, "err", err)
			}
		}
		if err := pns.MoveLinkAt(index, p.host, back); err != nil {
			// It may have left under its pod name: found below.
			logger.V(2).Info("Move back incomplete", "vf", addr, "link", inPod, "err", err)
		}
		if name, err = p.hostNetdev(addr); err != nil {
			return "", err
		}
	}
	if name != pl.Host.Name || !p.hostLinkIs(name, back) {
		if err := p.host.SetLink(name, back); err != nil {
			return "", err
		}
		name = pl.Host.Name
	}
	if err := p.host.RestoreLink(name, pl.Host); err != nil {
		return "", err
	}
	if err := p.ledger.Delete(addr); err != nil {
		return "", err
	}
	logger.V(2).Info("VF returned to the host", "vf", addr, "netdev", name, "pod", pl.PodRef)
	return name, nil
}

// hostLinkIs: the host link has MTU and MAC as wanted.
func (p *Plugin) hostLinkIs(name string, want sriov.LinkSettings) bool {
	st, err := p.host.ReadLink(name)
	return err == nil && (want.MTU == 0 || st.MTU == want.MTU) && (want.MAC == "" || st.MAC == want.MAC)
}

// errNotBack: a VF whose namespace is gone has not come back yet.
var errNotBack = errors.New("the VF is not back in the host yet")

// awaitReturn waits up to wait for a VF whose namespace is gone to be
// back in the host, and returns its netdev there.
func (p *Plugin) awaitReturn(addr string, pl Placement, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		name, err := p.hostNetdev(addr)
		if err == nil {
			return name, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("pod %s's network namespace %s is gone and %w: %w", pl.PodRef, pl.Netns, errNotBack, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// errMissing: a VF is neither in its pod's namespace nor in the host.
var errMissing = errors.New("the VF is neither in its pod's network namespace nor in the host")

// ReasonVFMissing is the reason of the Warning Event on a pod whose VF
// cannot be found to return it.
const ReasonVFMissing = "VFNotFound"

// missing reports a VF that is neither in its pod's namespace nor in the
// host: whoever holds the pod's namespace (a container with
// CAP_NET_ADMIN) moved it on, or its name and a lookalike were swapped.
// Nothing is moved or configured, its record is kept, and the return is
// retried (stop, unprepare, resync); the kernel returns a VF to the host
// when the namespace it is in is destroyed.
func (p *Plugin) missing(ctx context.Context, addr string, pl Placement, err error) error {
	err = fmt.Errorf("pod %s, VF %s (claim %s, interface %s): %w (%w); its placement is kept and the return retried",
		pl.PodRef, addr, pl.Claim, pl.Interface, errMissing, err)
	klog.FromContext(ctx).Info("Warning: cannot return a VF: not found in its pod's network namespace by its PCI function, nor in the host", "pod", pl.PodRef, "vf", addr, "err", err)
	if p.opts.Events != nil {
		ns, name, _ := strings.Cut(pl.PodRef, "/")
		pod := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: name, UID: pl.Pod}
		p.opts.Events.Eventf(pod, nil, corev1.EventTypeWarning, ReasonVFMissing, "ReturnVF",
			"VF %s is not in the pod's network namespace (found by its PCI function, not by name) nor in the host: it stays recorded and its return is retried; the kernel returns it when the namespace that holds it is destroyed", addr)
	}
	return err
}
