// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// Objects renders a driver's resources for one node as the ResourceSlice
// objects the kubeletplugin's slice controller writes: same spec, pool
// generation 1, and names in the controller's "<hex index>-<driver>-<node>"
// scheme (without its random suffix), which the controller recognises, so
// slices applied from this output are adopted rather than duplicated.
func Objects(driver, nodeName string, res resourceslice.DriverResources) []resourceapi.ResourceSlice {
	var pools []string
	for name := range res.Pools {
		pools = append(pools, name)
	}
	sort.Strings(pools)
	var out []resourceapi.ResourceSlice
	for _, poolName := range pools {
		p := res.Pools[poolName]
		width := max(5, len(fmt.Sprintf("%x", max(len(p.Slices)-1, 0))))
		for i, s := range p.Slices {
			out = append(out, resourceapi.ResourceSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
				ObjectMeta: metav1.ObjectMeta{
					Name: fmt.Sprintf("%0*x-%s-%s", width, i, driver, nodeName),
				},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:                 driver,
					NodeName:               &nodeName,
					Pool:                   resourceapi.ResourcePool{Name: poolName, Generation: 1, ResourceSliceCount: int64(len(p.Slices))},
					Devices:                s.Devices,
					SharedCounters:         s.SharedCounters,
					PerDeviceNodeSelection: s.PerDeviceNodeSelection,
					PartitionTypeAttribute: s.PartitionTypeAttribute,
					SkipNodeOperations:     s.SkipNodeOperations,
				},
			})
		}
	}
	return out
}
