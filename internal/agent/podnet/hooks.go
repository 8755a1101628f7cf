// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/containerd/nri/pkg/api"
	nriplugin "github.com/containerd/nri/pkg/plugin"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/prepare/nic"
)

// hooks are the plugin's NRI handlers (the stub finds them by interface).
// The runtime sends one request at a time and drops a plugin that misses
// its timeout (2 s in containerd), after which pods start without it: no
// handler waits on the API server (status is written in the background)
// or for a VF to come back from a destroyed namespace (unprepare does).
type hooks struct{ p *Plugin }

// Synchronize reconciles the placements with the runtime's sandboxes
// after a connect (agent or runtime restart): VFs of pods that are gone
// or stopped come back; VFs of running pods stay and are recorded, and a
// running pod whose VFs never arrived (the agent was down when it
// started) gets them now. It never fails: a failed Synchronize would make
// the runtime drop the plugin.
func (h *hooks) Synchronize(ctx context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	defer h.observe("Synchronize", time.Now(), new(error))
	p := h.p
	logger := klog.FromContext(ctx)
	running := map[types.UID]pod{}
	for _, sb := range pods {
		if pd := podOf(sb); pd.Netns != "" {
			running[pd.UID] = pd
		}
	}
	for _, addr := range p.ledger.Keys() {
		pl, ok := p.ledger.Get(addr)
		if !ok {
			continue
		}
		if pd, ok := running[pl.Pod]; ok && pd.Netns == pl.Netns {
			continue
		}
		unlock := p.vfs.Lock(addr)
		_, err := p.release(ctx, addr, 0)
		unlock()
		if err != nil {
			logger.Error(err, "Cannot return a VF whose pod is gone yet; unprepare retries", "vf", addr, "pod", pl.PodRef)
		}
	}
	uids := make([]types.UID, 0, len(running))
	for uid := range running {
		uids = append(uids, uid)
	}
	sort.Slice(uids, func(i, j int) bool { return uids[i] < uids[j] })
	claims := p.prepared.Claims()
	for _, uid := range uids {
		pd := running[uid]
		if err := p.runPod(ctx, pd, claims, true); err != nil {
			logger.Error(err, "Pod running without its VFs", "pod", pd.Ref)
		}
	}
	p.setSynced(true, nil)
	logger.Info("Synchronized with the container runtime", "sandboxes", len(pods), "placements", len(p.ledger.Keys()))
	return nil, nil
}

// RunPodSandbox moves the pod's VFs in and writes their metadata before
// any of its containers exists.
func (h *hooks) RunPodSandbox(ctx context.Context, sb *api.PodSandbox) (err error) {
	defer h.observe("RunPodSandbox", time.Now(), &err)
	return h.p.runPod(ctx, podOf(sb), h.p.prepared.Claims(), false)
}

// CreateContainer lets a container of a pod with VFs be created only
// with every VF in the pod: a sandbox that started while the plugin was
// down or dropped (containerd drops a plugin that misses its timeout, and
// the sandbox starts without it) gets its VFs now, or the container is
// refused and the kubelet retries it. With the runtime's default
// validator requiring this plugin for the pod (docs/operator-guide.md), no container of
// such a pod starts while the plugin is away.
func (h *hooks) CreateContainer(ctx context.Context, sb *api.PodSandbox, ctr *api.Container) (_ *api.ContainerAdjustment, _ []*api.ContainerUpdate, err error) {
	defer h.observe("CreateContainer", time.Now(), &err)
	if err := h.p.ensurePod(ctx, podOf(sb)); err != nil {
		return nil, nil, fmt.Errorf("container %s: %w", ctr.GetName(), err)
	}
	return nil, nil, nil
}

// StopPodSandbox returns the pod's VFs; the runtime tears the network
// namespace down right after.
func (h *hooks) StopPodSandbox(ctx context.Context, sb *api.PodSandbox) (err error) {
	defer h.observe("StopPodSandbox", time.Now(), &err)
	return h.p.stopPod(ctx, sb)
}

// RemovePodSandbox returns whatever the stop hook left (the namespace is
// gone by now).
func (h *hooks) RemovePodSandbox(ctx context.Context, sb *api.PodSandbox) (err error) {
	defer h.observe("RemovePodSandbox", time.Now(), &err)
	return h.p.stopPod(ctx, sb)
}

// observe reports a hook's duration and error (Options.Observer).
func (h *hooks) observe(hook string, start time.Time, err *error) {
	if o := h.p.opts.Observer; o != nil {
		o.ObserveHook(hook, time.Since(start), *err)
	}
}

// stopPod returns a pod's VFs without waiting: a VF whose namespace is
// gone and that is not back in the host yet is logged and left to
// unprepare, which waits for it (cri-o removes the namespace before the
// stop hook; the kernel returns a VF from a destroyed namespace in the
// background).
func (p *Plugin) stopPod(ctx context.Context, sb *api.PodSandbox) error {
	p.stopping(types.UID(sb.GetUid()))
	var errs []error
	for _, err := range unjoin(p.detachPod(ctx, types.UID(sb.GetUid()), 0)) {
		if errors.Is(err, errNotBack) {
			klog.FromContext(ctx).Info("A VF of the stopped pod is not back in the host yet; unprepare returns it", "pod", sb.GetNamespace()+"/"+sb.GetName(), "err", err)
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// unjoin splits an errors.Join.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// Shutdown: the runtime is going away; Run reconnects.
func (h *hooks) Shutdown(context.Context) { h.p.setSynced(false, errors.New("the runtime shut down")) }

// podOf reads a sandbox: its network namespace is the path of its
// "network" Linux namespace ("" for a host-network pod, and where the
// runtime leaves it out).
func podOf(sb *api.PodSandbox) pod {
	pd := pod{UID: types.UID(sb.GetUid()), Namespace: sb.GetNamespace(), Name: sb.GetName(),
		Ref: sb.GetNamespace() + "/" + sb.GetName(), Annotations: sb.GetAnnotations()}
	for _, ns := range sb.GetLinux().GetNamespaces() {
		if ns.GetType() == "network" {
			pd.Netns = ns.GetPath()
		}
	}
	return pd
}

// runPod attaches the pod's VFs, writes the metadata of those it moved
// (generation 2, with networkData; a VF already in the pod has its
// metadata, and a second hook changes nothing) and queues their claims'
// status: of the moved ones, and on resync (Synchronize) of all, since a
// write queued before a crash is lost. Any failure undoes everything done
// for the pod, or on resync what this call moved, and is reported in the
// claims' status.
func (p *Plugin) runPod(ctx context.Context, pd pod, claims map[types.UID]prepare.Claim[nic.Record], resync bool) error {
	atts, err := plan(pd, claims, p.uses(pd))
	if err != nil {
		p.failed(atts, err)
		return fmt.Errorf("pod %s: %w", pd.Ref, err)
	}
	if len(atts) == 0 {
		return nil
	}
	if err := p.elsewhere(pd, atts); err != nil {
		// Not the claims' failure: their VFs serve the other pod.
		return fmt.Errorf("pod %s: %w", pd.Ref, err)
	}
	if !resync && !requiresPlugin(pd) {
		klog.FromContext(ctx).Info("Warning: a pod with VFs does not require this NRI plugin: if the agent is down or slow when its containers are created, they start without their network interfaces",
			"pod", pd.Ref, "annotation", RequiredPluginsAnnotation+`/pod: '["`+PluginName+`"]'`)
	}
	start := time.Now()
	done, moved, err := p.attachAll(ctx, pd, atts)
	if err == nil {
		err = p.writeMetadata(ctx, claims, done)
	}
	if err != nil {
		// Undo everything done for the pod; a running pod (resync) keeps
		// the VFs it had.
		var rb error
		if resync {
			rb = p.releaseAll(ctx, moved)
		} else {
			rb = p.detachPod(ctx, pd.UID, 0)
		}
		if rb != nil {
			err = errors.Join(err, fmt.Errorf("rolling back: %w", rb))
		}
		p.failed(atts, err)
		return fmt.Errorf("pod %s: %w", pd.Ref, err)
	}
	p.succeeded(done, resync)
	klog.FromContext(ctx).V(2).Info("VFs in the pod", "pod", pd.Ref, "vfs", len(done), "took", time.Since(start))
	return nil
}

// ensurePod makes sure every VF of the pod is in it (CreateContainer): it
// attaches what is missing, as on resync, and fails when it cannot.
func (p *Plugin) ensurePod(ctx context.Context, pd pod) error {
	claims := p.prepared.Claims()
	atts, err := plan(pd, claims, p.uses(pd))
	if err != nil {
		return fmt.Errorf("pod %s: %w", pd.Ref, err)
	}
	for _, a := range atts {
		if pl, ok := p.ledger.Get(a.VF.PCIAddress); !ok || pl.Pod != pd.UID || pl.Netns != pd.Netns {
			klog.FromContext(ctx).Info("A container is being created in a pod without all of its VFs: attaching them first", "pod", pd.Ref, "vf", a.VF.PCIAddress)
			return p.runPod(ctx, pd, claims, true)
		}
	}
	return nil
}

// uses are the names of the ResourceClaims the pod refers to, as far as
// Options.Pods knows the pod.
func (p *Plugin) uses(pd pod) []string {
	if p.opts.Pods == nil {
		return nil
	}
	return p.opts.Pods.ClaimsOf(pd.Namespace, pd.Name, pd.UID)
}

// RequiredPluginsAnnotation is NRI's pod annotation naming the plugins a
// pod's containers need: with the runtime's default validator enabled,
// a container of such a pod is not created while one of them is missing.
const RequiredPluginsAnnotation = nriplugin.RequiredPluginsAnnotation

// requiresPlugin: the pod's annotations require this plugin for all of its
// containers (pod-scoped: "<annotation>/pod" or "<annotation>").
func requiresPlugin(pd pod) bool {
	for _, key := range []string{RequiredPluginsAnnotation + "/pod", RequiredPluginsAnnotation} {
		v, ok := pd.Annotations[key]
		if !ok {
			continue
		}
		var names []string
		if err := yaml.Unmarshal([]byte(v), &names); err != nil {
			return false
		}
		return slices.Contains(names, PluginName) || slices.Contains(names, PluginIndex+"-"+PluginName)
	}
	return false
}

// writeMetadata rewrites the metadata file of each request with a VF
// moved now, with the devices' networkData.
func (p *Plugin) writeMetadata(ctx context.Context, claims map[types.UID]prepare.Claim[nic.Record], done []attached) error {
	type key struct {
		claim   types.UID
		request string
	}
	net := map[key]map[string]*resourceapi.NetworkDeviceData{} // by device key
	var order []key
	for _, d := range done {
		if !d.Moved {
			continue
		}
		k := key{d.Claim.UID, d.VF.Request}
		if net[k] == nil {
			net[k] = map[string]*resourceapi.NetworkDeviceData{}
			order = append(order, k)
		}
		net[k][deviceKey(d.VF.Pool, d.VF.Device, d.VF.ShareID)] = networkData(d)
	}
	for _, k := range order {
		c := claims[k.claim]
		var devices []kubeletplugin.Device
		for _, dev := range c.Devices {
			if !contains(dev.Requests, k.request) {
				continue
			}
			kd := dev.Kubelet()
			if kd.Metadata == nil {
				kd.Metadata = &kubeletplugin.DeviceMetadata{}
			}
			kd.Metadata.NetworkData = net[k][deviceKey(dev.Pool, dev.Device, dev.ShareID)]
			devices = append(devices, kd)
		}
		if err := p.meta.UpdateRequestMetadata(ctx, c.Namespace, c.Name, k.claim, k.request, devices); err != nil {
			names := make([]string, 0, len(devices))
			for _, d := range devices {
				names = append(names, d.DeviceName)
			}
			return fmt.Errorf("claim %s/%s, request %q (devices %v): writing metadata: %w", c.Namespace, c.Name, k.request, names, err)
		}
	}
	return nil
}

// networkData is what the pod sees of a VF.
func networkData(d attached) *resourceapi.NetworkDeviceData {
	return metadata.Network(d.Interface, d.Addresses, d.MAC)
}

func deviceKey(pool, device string, share *types.UID) string {
	k := pool + "/" + device
	if share != nil {
		k += "/" + string(*share)
	}
	return k
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
