// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package allocate runs the scheduler's own structured allocator in process:
// the lab command and the tests use it to allocate claims against the slices
// this agent publishes, exactly as kube-scheduler would.
package allocate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// ClusterFeatures are the DRA features of the clusters hwdra targets
// (Kubernetes 1.37 with the DRA gates hwdra's device model uses).
var ClusterFeatures = structured.Features{
	AdminAccess:          true,
	CompatibilityGroups:  true,
	ConsumableCapacity:   true,
	DeviceTaints:         true,
	PartitionableDevices: true,
	PrioritizedList:      true,
}

// ErrUnsatisfiable is returned when the claims do not fit the node.
var ErrUnsatisfiable = errors.New("claims cannot be allocated on this node")

// Allocator allocates claims one call at a time and remembers what it has
// handed out, so later calls see earlier allocations the way the scheduler
// sees allocated claims.
type Allocator struct {
	features structured.Features
	node     *v1.Node
	slices   []*resourceapi.ResourceSlice
	classes  classes
	cel      *cel.Cache

	mu    sync.Mutex
	state structured.AllocatedState
	// holders are the claims that hold each device (Explain names them).
	holders map[deviceKey][]string
}

// New returns an allocator for one node's slices and the given classes.
func New(features structured.Features, nodeName string, slices []*resourceapi.ResourceSlice, deviceClasses []*resourceapi.DeviceClass) *Allocator {
	return &Allocator{
		features: features,
		node:     Node(nodeName),
		slices:   slices,
		classes:  ClassLister(deviceClasses).(classes),
		cel:      cel.NewCache(100, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity}),
		state:    EmptyState(),
	}
}

// Node is a Node object as the allocator matches node selectors against.
func Node(name string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
}

// ClassLister serves DeviceClasses to the structured allocator.
func ClassLister(deviceClasses []*resourceapi.DeviceClass) structured.DeviceClassLister {
	cs := classes{}
	for _, c := range deviceClasses {
		cs[c.Name] = c
	}
	return cs
}

// EmptyState is the allocated state of a cluster where nothing is
// allocated.
func EmptyState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// Request asks for count devices of a DeviceClass that match a CEL
// selector (none when empty): the request of most claims, for tools and
// tests.
func Request(name, class string, count int64, cel string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
	}}
	if cel != "" {
		r.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}
	}
	return r
}

// AddClasses makes more DeviceClasses known to later calls.
func (a *Allocator) AddClasses(deviceClasses ...*resourceapi.DeviceClass) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range deviceClasses {
		a.classes[c.Name] = c
	}
}

// Allocate allocates all claims together. On success each claim's
// status.allocation is set and its devices count as in use for later calls;
// when they do not fit the error wraps ErrUnsatisfiable and nothing changes.
func (a *Allocator) Allocate(ctx context.Context, claims ...*resourceapi.ResourceClaim) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	results, err := a.allocate(ctx, claims)
	if err != nil {
		return err
	}
	for i := range claims {
		claims[i].Status.Allocation = &results[i]
		a.track(&results[i], true)
		a.holdRecord(claims[i].Name, &results[i], true)
	}
	return nil
}

// Fits is Allocate without the allocation: nil when the claims could be
// allocated together now, beside what is allocated; the claims and the
// allocator stay as they are.
func (a *Allocator) Fits(ctx context.Context, claims ...*resourceapi.ResourceClaim) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, err := a.allocate(ctx, claims)
	return err
}

// allocate runs the scheduler's allocator over the claims; a.mu is held.
func (a *Allocator) allocate(ctx context.Context, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	alloc, err := structured.NewAllocator(ctx, a.features, a.state, a.classes, a.slices, a.cel)
	if err != nil {
		return nil, err
	}
	results, err := alloc.Allocate(ctx, a.node, claims)
	if err != nil {
		return nil, fmt.Errorf("allocate: %w", err)
	}
	if results == nil {
		return nil, fmt.Errorf("%w (%d claim(s))", ErrUnsatisfiable, len(claims))
	}
	return results, nil
}

// Empty is an allocator of the same node and classes with nothing
// allocated.
func (a *Allocator) Empty() *Allocator {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &Allocator{features: a.features, node: a.node, slices: a.slices, classes: a.classes, cel: a.cel, state: EmptyState()}
}

// Release returns a claim's devices, as deleting an allocated claim does.
func (a *Allocator) Release(claim *resourceapi.ResourceClaim) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if claim.Status.Allocation != nil {
		a.track(claim.Status.Allocation, false)
		a.holdRecord(claim.Name, claim.Status.Allocation, false)
		claim.Status.Allocation = nil
	}
}

// track records (or forgets) what a result uses, as the scheduler derives
// its allocated state from allocated claims (kube-scheduler's
// dynamicresources foreachAllocatedDevice): a device taken with admin
// access is not in use, so later claims may still have it.
func (a *Allocator) track(result *resourceapi.AllocationResult, add bool) {
	for _, r := range result.Devices.Results {
		if ptr.Deref(r.AdminAccess, false) {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			if add {
				a.state.AllocatedDevices.Insert(id)
			} else {
				a.state.AllocatedDevices.Delete(id)
			}
			continue
		}
		shared := structured.MakeSharedDeviceID(id, r.ShareID)
		consumed := structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity)
		if add {
			a.state.AllocatedSharedDeviceIDs.Insert(shared)
			a.state.AggregatedCapacity.Insert(consumed)
		} else {
			a.state.AllocatedSharedDeviceIDs.Delete(shared)
			a.state.AggregatedCapacity.Remove(consumed)
		}
	}
}

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classes) names() []string {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}
