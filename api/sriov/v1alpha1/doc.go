// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package v1alpha1 is the opaque device configuration of sriov.hwdra.io,
// set in a DeviceClass's or ResourceClaim's config.opaque.parameters.
//
// +k8s:deepcopy-gen=package
package v1alpha1
