// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// nodePods is one informer of the node's pods for everything that asks
// about them (the NRI plugin: the claims a pod names; the share police:
// a process's pod, container and claims), started once by the first that
// needs it.
type nodePods struct {
	inf  coreinformers.PodInformer
	once sync.Once
}

const podUIDIndex = "uid"

// newNodePods makes the informer, each pod cut to what its readers use.
func newNodePods(client kubernetes.Interface, node string) *nodePods {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + node }),
		informers.WithTransform(func(obj any) (any, error) {
			pod, ok := obj.(*corev1.Pod)
			if !ok {
				return obj, nil
			}
			return cutPod(pod), nil
		}))
	inf := factory.Core().V1().Pods()
	_ = inf.Informer().AddIndexers(cache.Indexers{podUIDIndex: func(obj any) ([]string, error) {
		if pod, ok := obj.(*corev1.Pod); ok {
			return []string{string(pod.UID)}, nil
		}
		return nil, nil
	}})
	return &nodePods{inf: inf}
}

// cutPod keeps a pod's identity, its claims, its containers' names and
// claims, and its containers' runtime IDs.
func cutPod(pod *corev1.Pod) *corev1.Pod {
	cut := func(cs []corev1.Container) []corev1.Container {
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i] = corev1.Container{Name: c.Name, Resources: corev1.ResourceRequirements{Claims: c.Resources.Claims}}
		}
		return out
	}
	ids := func(ss []corev1.ContainerStatus) []corev1.ContainerStatus {
		out := make([]corev1.ContainerStatus, len(ss))
		for i, s := range ss {
			out[i] = corev1.ContainerStatus{Name: s.Name, ContainerID: s.ContainerID}
		}
		return out
	}
	eph := make([]corev1.EphemeralContainer, len(pod.Spec.EphemeralContainers))
	for i, e := range pod.Spec.EphemeralContainers {
		eph[i].Name, eph[i].Resources.Claims = e.Name, e.Resources.Claims
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec: corev1.PodSpec{
			ResourceClaims: pod.Spec.ResourceClaims,
			InitContainers: cut(pod.Spec.InitContainers), Containers: cut(pod.Spec.Containers), EphemeralContainers: eph,
		},
		Status: corev1.PodStatus{
			ResourceClaimStatuses: pod.Status.ResourceClaimStatuses, ExtendedResourceClaimStatus: pod.Status.ExtendedResourceClaimStatus,
			InitContainerStatuses: ids(pod.Status.InitContainerStatuses), ContainerStatuses: ids(pod.Status.ContainerStatuses),
			EphemeralContainerStatuses: ids(pod.Status.EphemeralContainerStatuses),
		},
	}
}

// start runs the informer until ctx ends; only the first call does.
func (p *nodePods) start(ctx context.Context) {
	p.once.Do(func() { go p.inf.Informer().Run(ctx.Done()) })
}

// PodByUID finds a pod of the node by UID (police.Pods).
func (p *nodePods) PodByUID(uid types.UID) (*corev1.Pod, bool) {
	objs, err := p.inf.Informer().GetIndexer().ByIndex(podUIDIndex, string(uid))
	if err != nil || len(objs) == 0 {
		return nil, false
	}
	pod, ok := objs[0].(*corev1.Pod)
	return pod, ok
}
