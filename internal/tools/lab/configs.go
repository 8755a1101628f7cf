// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hwdra/hwdra/api"
)

// opaqueParameters decodes the parameters of a config for one of hwdra's
// drivers as its prepare will (api.Decode: every problem of the document
// at once), so that each claim's are said with the rest of the files'
// problems, not one claim's at a time at prepare.
func opaqueParameters(o *resourceapi.OpaqueDeviceConfiguration, p *field.Path) []string {
	if !slices.Contains(api.Drivers, o.Driver) {
		return nil // another driver's (or none's: said after allocation)
	}
	at := p.Child("parameters").String() + ": "
	obj, err := api.Decode(o.Parameters.Raw)
	if err != nil {
		var errs []string
		for _, e := range flatten(err) {
			errs = append(errs, at+e.Error())
		}
		return errs
	}
	if gv := obj.GetObjectKind().GroupVersionKind().GroupVersion(); gv.Group != o.Driver {
		return []string{fmt.Sprintf("%s%s %s is not a config of driver %s (its configs are of apiVersion %s/...)", at, gv, obj.GetObjectKind().GroupVersionKind().Kind, o.Driver, o.Driver)}
	}
	return nil
}

// configErrors are the problems of a claim's configs for hwdra's
// drivers (opaqueParameters), which the API server does not look at and
// prepare refuses: said with the rest of the files' problems.
func configErrors(c *resourceapi.ResourceClaim) error {
	var lines []string
	for i, cfg := range c.Spec.Devices.Config {
		if cfg.Opaque != nil {
			lines = append(lines, opaqueParameters(cfg.Opaque, field.NewPath("spec", "devices", "config").Index(i).Child("opaque"))...)
		}
	}
	if len(lines) == 0 {
		return nil
	}
	return fmt.Errorf("ResourceClaim %q: configs its prepare refuses:\n  %s", c.Name, strings.Join(lines, "\n  "))
}

// flatten lists an aggregate's errors (api.Decode joins several).
func flatten(err error) []error {
	if agg, ok := err.(utilerrors.Aggregate); ok {
		return agg.Errors()
	}
	return []error{err}
}
