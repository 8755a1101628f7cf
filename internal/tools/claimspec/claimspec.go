// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package claimspec reads ResourceClaims and ResourceClaimTemplates of
// every version the API server serves (v1, v1beta2, v1beta1) as v1.
package claimspec

import (
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	sigsjson "sigs.k8s.io/json"
)

// The API server serves ResourceClaims and ResourceClaimTemplates as
// v1beta1 and v1beta2 too and converts them to v1. Its conversions live
// in k8s.io/kubernetes (pkg/apis/resource/v1beta1, v1beta2), which is
// not a dependency, so hwdra converts the claim's spec itself (the lab, hwdra convert): in
// k8s.io/api v0.37.2 v1beta2's spec is v1's field for field, and
// v1beta1's differs only in a request's own fields, which v1 moved under
// `exactly` (Convert_v1beta1_DeviceRequest_To_resource_DeviceRequest:
// `exactly` is made where any of them is set). The parts that are the
// same go through JSON, strictly, so a field one side lacks is an error
// (TestConvert), never dropped.

// FromV1beta2 converts a v1beta2 claim spec to v1.
func FromV1beta2(in resourcev1beta2.ResourceClaimSpec) (resourceapi.ResourceClaimSpec, error) {
	var out resourceapi.ResourceClaimSpec
	return out, sameShape(in, &out)
}

// FromV1beta1 converts a v1beta1 claim spec to v1.
func FromV1beta1(in resourcev1beta1.ResourceClaimSpec) (resourceapi.ResourceClaimSpec, error) {
	requests := in.Devices.Requests
	in.Devices.Requests = nil
	var out resourceapi.ResourceClaimSpec
	if err := sameShape(in, &out); err != nil {
		return out, err
	}
	for _, r := range requests {
		req := resourceapi.DeviceRequest{Name: r.Name}
		if err := sameShape(r.FirstAvailable, &req.FirstAvailable); err != nil {
			return out, err
		}
		if r.DeviceClassName != "" || r.Selectors != nil || r.AllocationMode != "" || r.Count != 0 || r.AdminAccess != nil ||
			r.Tolerations != nil || r.Capacity != nil || r.DerivedAttributes != nil {
			e := &resourceapi.ExactDeviceRequest{
				DeviceClassName: r.DeviceClassName,
				AllocationMode:  resourceapi.DeviceAllocationMode(r.AllocationMode),
				Count:           r.Count,
				AdminAccess:     r.AdminAccess,
			}
			for _, part := range []struct{ in, out any }{
				{r.Selectors, &e.Selectors}, {r.Tolerations, &e.Tolerations}, {r.Capacity, &e.Capacity}, {r.DerivedAttributes, &e.DerivedAttributes},
			} {
				if err := sameShape(part.in, part.out); err != nil {
					return out, err
				}
			}
			req.Exactly = e
		}
		out.Devices.Requests = append(out.Devices.Requests, req)
	}
	return out, nil
}

// sameShape copies in to out, types whose JSON is the same.
func sameShape(in, out any) error {
	js, err := json.Marshal(in)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(js, out, sigsjson.DisallowUnknownFields)
	if err == nil && len(strict) > 0 {
		err = strict[0]
	}
	if err != nil {
		return fmt.Errorf("converting %T to %T: %w", in, out, err)
	}
	return nil
}

// DecodeClaim decodes a ResourceClaim of a version the API server serves,
// as v1; strict decodes the document into what it is given.
func DecodeClaim(version string, strict func(any) error) (*resourceapi.ResourceClaim, error) {
	c := &resourceapi.ResourceClaim{}
	var err error
	switch version {
	case "v1beta1":
		var in resourcev1beta1.ResourceClaim
		if err = strict(&in); err == nil {
			c.ObjectMeta = in.ObjectMeta
			c.Spec, err = FromV1beta1(in.Spec)
		}
	case "v1beta2":
		var in resourcev1beta2.ResourceClaim
		if err = strict(&in); err == nil {
			c.ObjectMeta = in.ObjectMeta
			c.Spec, err = FromV1beta2(in.Spec)
		}
	default:
		err = strict(c)
	}
	c.Status = resourceapi.ResourceClaimStatus{} // as on create: the API server drops a new claim's status
	return c, err
}

// DecodeTemplate is DecodeClaim's for a ResourceClaimTemplate.
func DecodeTemplate(version string, strict func(any) error) (*resourceapi.ResourceClaimTemplate, error) {
	t := &resourceapi.ResourceClaimTemplate{}
	var err error
	switch version {
	case "v1beta1":
		var in resourcev1beta1.ResourceClaimTemplate
		if err = strict(&in); err == nil {
			t.ObjectMeta, t.Spec.ObjectMeta = in.ObjectMeta, in.Spec.ObjectMeta
			t.Spec.Spec, err = FromV1beta1(in.Spec.Spec)
		}
	case "v1beta2":
		var in resourcev1beta2.ResourceClaimTemplate
		if err = strict(&in); err == nil {
			t.ObjectMeta, t.Spec.ObjectMeta = in.ObjectMeta, in.Spec.ObjectMeta
			t.Spec.Spec, err = FromV1beta2(in.Spec.Spec)
		}
	default:
		err = strict(t)
	}
	return t, err
}
