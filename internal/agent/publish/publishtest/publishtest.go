// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package publishtest makes a fake API server (client-go's fake clientset)
// that behaves as the real one where the ResourceSlice controllers and the
// publisher rely on it, for tests of the publisher and of the agent.
package publishtest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// NewClientset is a fake clientset holding objects that, unlike the plain
// one, names created objects from their generateName (the slice
// controller relies on it), answers dry-run creates with the object and
// stores nothing (the publisher's feature recheck), and filters
// ResourceSlice lists and watches by field selector: the slice controller
// of each driver selects its own driver's slices, and without the filter
// each would take the other's for obsolete slices of its pool.
func NewClientset(objects ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objects...)
	seq := 0 // reactors run under the clientset's lock
	c.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		create := action.(k8stesting.CreateAction)
		if obj, ok := create.GetObject().(metav1.Object); ok && obj.GetName() == "" && obj.GetGenerateName() != "" {
			seq++
			obj.SetName(fmt.Sprintf("%s%05d", obj.GetGenerateName(), seq))
		}
		if impl, ok := create.(k8stesting.CreateActionImpl); ok && len(impl.CreateOptions.DryRun) > 0 {
			return true, create.GetObject(), nil
		}
		return false, nil, nil
	})
	honourSliceFieldSelectors(c)
	return c
}

func honourSliceFieldSelectors(c *fake.Clientset) {
	gvr := resourceapi.SchemeGroupVersion.WithResource("resourceslices")
	match := func(sel fields.Selector, obj runtime.Object) bool {
		s, ok := obj.(*resourceapi.ResourceSlice)
		if !ok || sel == nil {
			return true
		}
		set := fields.Set{resourceapi.ResourceSliceSelectorDriver: s.Spec.Driver, resourceapi.ResourceSliceSelectorPoolName: s.Spec.Pool.Name}
		if s.Spec.NodeName != nil {
			set[resourceapi.ResourceSliceSelectorNodeName] = *s.Spec.NodeName
		}
		return sel.Matches(set)
	}
	c.PrependReactor("list", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		sel := action.(k8stesting.ListAction).GetListRestrictions().Fields
		obj, err := c.Tracker().List(gvr, resourceapi.SchemeGroupVersion.WithKind("ResourceSlice"), "")
		if err != nil {
			return true, nil, err
		}
		list := obj.(*resourceapi.ResourceSliceList)
		list.Items = slices.DeleteFunc(list.Items, func(s resourceapi.ResourceSlice) bool { return !match(sel, &s) })
		return true, list, nil
	})
	c.PrependWatchReactor("resourceslices", func(action k8stesting.Action) (bool, watch.Interface, error) {
		sel := action.(k8stesting.WatchAction).GetWatchRestrictions().Fields
		w, err := c.Tracker().Watch(gvr, "")
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) { return e, match(sel, e.Object) }), nil
	})
}

// Writes counts the ResourceSlice creates, updates, patches and deletes
// the clientset received.
func Writes(c *fake.Clientset) int {
	n := 0
	for _, act := range c.Actions() {
		if act.GetResource().Resource == "resourceslices" && slices.Contains([]string{"create", "update", "patch", "delete"}, act.GetVerb()) {
			n++
		}
	}
	return n
}

// WaitPool waits until the driver's stored pool is complete and ok (if
// set) holds for it, and returns it; after 30 s the test fails.
func WaitPool(t testing.TB, c kubernetes.Interface, driver string, ok func([]*resourceapi.ResourceSlice) bool) []*resourceapi.ResourceSlice {
	t.Helper()
	var ss []*resourceapi.ResourceSlice
	waitfor.True(t, "a complete pool of "+driver+" as expected", 30*time.Second, func() bool {
		var err error
		if ss, err = pool(c, driver); err != nil {
			t.Fatal(err)
		}
		return ss != nil && (ok == nil || ok(ss))
	})
	return ss
}

// pool is a driver's pool as stored: the slices of its latest generation,
// nil until that generation is complete.
func pool(c kubernetes.Interface, driver string) ([]*resourceapi.ResourceSlice, error) {
	list, err := c.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	gen := int64(-1)
	for i := range list.Items {
		if s := &list.Items[i]; s.Spec.Driver == driver {
			gen = max(gen, s.Spec.Pool.Generation)
		}
	}
	var out []*resourceapi.ResourceSlice
	for i := range list.Items {
		if s := &list.Items[i]; s.Spec.Driver == driver && s.Spec.Pool.Generation == gen {
			out = append(out, s)
		}
	}
	if len(out) == 0 || int64(len(out)) != out[0].Spec.Pool.ResourceSliceCount {
		return nil, nil
	}
	return out, nil
}
