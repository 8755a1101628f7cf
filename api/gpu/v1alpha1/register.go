// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion of these types.
var GroupVersion = schema.GroupVersion{Group: "gpu.hwdra.io", Version: "v1alpha1"}

// AddToScheme registers the types.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &GpuConfig{})
	return nil
}
