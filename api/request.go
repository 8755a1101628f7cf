// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// ForRequest returns the configuration of type T that applies to one
// request of an allocated claim, or the zero T (defaulted) when none does.
// Configurations come from the DeviceClass first and the claim second;
// among those naming the driver and the request (or all requests) the
// last wins, so a claim overrides its class. Errors name the request,
// where the configuration came from and the field (the caller names the
// claim).
func ForRequest[T Object](claim *resourceapi.ResourceClaim, driver, request string, zero T) (T, error) {
	chosen, _, err := ForRequestFrom(claim, driver, request, zero)
	return chosen, err
}

// ForRequestFrom is ForRequest that also names the configuration it
// chose as its errors name one ("config[1] from the DeviceClass"), for
// the caller's own errors about its values; "" where none applies (the
// defaults).
func ForRequestFrom[T Object](claim *resourceapi.ResourceClaim, driver, request string, zero T) (T, string, error) {
	layers, err := Layers(claim, driver, request, zero)
	if err != nil {
		return zero, "", err
	}
	chosen, from := zero, ""
	if n := len(layers); n > 0 {
		chosen, from = layers[n-1].Config, layers[n-1].From
	}
	chosen.Default()
	return chosen, from, nil
}

// Layer is one opaque configuration that applies to a request, as its
// author wrote it: decoded strictly and validated, but not defaulted, so
// that what it sets can be told from what it leaves out.
type Layer[T Object] struct {
	Config T
	// From names it as errors do: "config[1] from the claim".
	From string
	// Class: it is the DeviceClass's (the administrator's), not the
	// claim's (whoever wrote the claim).
	Class bool
}

// Layers are the configurations of type T that apply to one request of
// an allocated claim, in the allocation's order: the DeviceClass's first,
// then the claim's. ForRequest is the last of them, defaulted. Errors name
// the request, where the configuration came from and the field.
func Layers[T Object](claim *resourceapi.ResourceClaim, driver, request string, zero T) ([]Layer[T], error) {
	if claim.Status.Allocation == nil {
		return nil, nil
	}
	var out []Layer[T]
	base, _, _ := strings.Cut(request, "/") // a subrequest's configs name its parent
	for i, c := range claim.Status.Allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driver {
			continue
		}
		if len(c.Requests) > 0 && !slices.Contains(c.Requests, request) && !slices.Contains(c.Requests, base) {
			continue
		}
		config := fmt.Sprintf("config[%d] from %s", i, sourceName(c.Source))
		where := fmt.Sprintf("request %q, %s", request, config)
		decoded, err := decodeAsWritten(c.Opaque.Parameters.Raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		typed, ok := decoded.(T)
		if !ok {
			return nil, fmt.Errorf("%s: %s is not a configuration for %s", where, decoded.GetObjectKind().GroupVersionKind().Kind, driver)
		}
		out = append(out, Layer[T]{Config: typed, From: config, Class: c.Source == resourceapi.AllocationConfigSourceClass})
	}
	return out, nil
}

func sourceName(s resourceapi.AllocationConfigSource) string {
	if s == resourceapi.AllocationConfigSourceClass {
		return "the DeviceClass"
	}
	return "the claim"
}

// Unapplied is an opaque configuration of an allocated claim that no
// driver reads: its driver owns none of the devices it applies to (another
// vendor's driver, such as NVIDIA's gpu.nvidia.com, or a typo). Drivers
// skip configurations that are not theirs, so without a word the claim
// would get defaults: an exclusive GPU instead of MPS.
type Unapplied struct {
	// Where names the configuration as the user wrote it:
	// "spec.devices.config[0]" of the claim, or "a config of DeviceClass X".
	Where string
	// Driver is the configuration's driver; Owners the drivers of the
	// devices it applies to.
	Driver string
	Owners []string
}

func (u Unapplied) String() string {
	s := fmt.Sprintf("%s is for driver %s, which owns none of the devices it applies to (%s): no driver reads it", u.Where, u.Driver, strings.Join(u.Owners, ", "))
	if hint := DriverHint(u.Driver); hint != "" {
		s += " (" + hint + ")"
	}
	return s
}

// UnappliedConfigs are the claim's opaque configurations that no driver
// of its allocation reads (none before allocation).
func UnappliedConfigs(claim *resourceapi.ResourceClaim) []Unapplied {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []Unapplied
	claimIndex := 0 // the allocation lists the classes' configs first, then the claim's in order
	for _, c := range claim.Status.Allocation.Devices.Config {
		where := fmt.Sprintf("spec.devices.config[%d]", claimIndex)
		if c.Source == resourceapi.AllocationConfigSourceClass {
			where = "a config of the DeviceClass"
		} else {
			claimIndex++
		}
		if c.Opaque == nil {
			continue
		}
		var owners []string
		applies := false
		for _, r := range claim.Status.Allocation.Devices.Results {
			base, _, _ := strings.Cut(r.Request, "/")
			if len(c.Requests) > 0 && !slices.Contains(c.Requests, r.Request) && !slices.Contains(c.Requests, base) {
				continue
			}
			applies = applies || r.Driver == c.Opaque.Driver
			if !slices.Contains(owners, r.Driver) {
				owners = append(owners, r.Driver)
			}
		}
		if !applies && len(owners) > 0 {
			slices.Sort(owners)
			out = append(out, Unapplied{Where: where, Driver: c.Opaque.Driver, Owners: owners})
		}
	}
	return out
}
