// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import resourceapi "k8s.io/api/resource/v1"

// Attribute constructors shared by the GPU and NIC builders.

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func integer(i int) resourceapi.DeviceAttribute {
	v := int64(i)
	return resourceapi.DeviceAttribute{IntValue: &v}
}

func boolean(b bool) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{BoolValue: &b} }
