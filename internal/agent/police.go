// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/police"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
)

// startPolicing starts the share police over the GPU driver's prepared
// claims: every gpus.shares interval it looks at the processes on the GPUs
// that serve shares (docs/design.md, "Policed shares").
func (s *server) startPolicing(ctx context.Context, gpu *GPU) {
	backend := s.node.GPU()
	if gpu == nil || backend == nil {
		return
	}
	policy := s.cfg.GPUPolicy()
	s.nodePods.start(ctx)
	w := police.New(police.Options{
		Claims: gpuClaims{gpu.Plugin}, Processes: backend, Pods: s.nodePods,
		Interval: policy.ShareCheckInterval(), Stop: policy.StopsShareOveruse(),
		Events:   s.events(ctx),
		Node:     nodeRef(s.opts.NodeName),
		Observer: s.m,
		ProcRoot: s.opts.procRoot,
	})
	ctx = klog.NewContext(ctx, klog.LoggerWithName(klog.FromContext(ctx), "police"))
	go w.Run(ctx)
}

// events is the agent's one Event recorder (the share police's findings,
// refused ResourceSlices), started at its first use. Without a sink the
// agent logs and counts what it would have recorded.
func (s *server) events(ctx context.Context) events.EventRecorder {
	s.recorderOnce.Do(func() {
		broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: s.claims.EventsV1()})
		if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Recording Events: the agent logs and counts what it finds, without Events")
		}
		s.onStop(broadcaster.Shutdown)
		s.recorder = broadcaster.NewRecorder(scheme.Scheme, "hwdra-agent")
	})
	return s.recorder
}

// nodeRef is the node as its Events' object. Its UID is the node's name,
// as the kubelet's Events have it, so that kubectl describe node, which
// asks for Events of the Node's UID and of its name, shows them.
func nodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
}

// gpuClaims are the GPU driver's prepared claims as the police reads them
// (police.Claims): each claim once per GPU it uses, with the share it was
// counted for where it is one.
type gpuClaims struct {
	plugin *prepare.Plugin[gpuprep.Record]
}

func (g gpuClaims) GPUClaims() []police.Claim {
	var out []police.Claim
	for _, c := range g.plugin.Claims() {
		for _, d := range c.Record.Devices {
			pc := police.Claim{Namespace: c.Namespace, Name: c.Name, GPU: d.GPU}
			if d.Sharing != nil && d.Sharing.Share != nil {
				sh := d.Sharing.Share
				pc.Share = &police.Share{Memory: sh.Memory, Compute: sh.Compute, Dedicated: sh.Dedicated}
			}
			out = append(out, pc)
		}
	}
	return out
}
