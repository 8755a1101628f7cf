// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"errors"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// mergeClasses adds the files' DeviceClasses to the chart's: a class of
// a name the chart has replaces the chart's (as applying it to a cluster
// would), one of a new name joins them; each is said in a note. Two of
// one name in the files is an error, as the second kubectl create of it.
func mergeClasses(chart []*resourceapi.DeviceClass, files []*readClass) ([]*resourceapi.DeviceClass, []string, error) {
	out := slices.Clone(chart)
	var (
		notes []string
		errs  []error
		seen  = map[string]string{}
	)
	for _, f := range files {
		name := f.class.Name
		if prev, dup := seen[name]; dup {
			errs = append(errs, fmt.Errorf("%s: DeviceClass %s already read from %s", f.at, name, prev))
			continue
		}
		seen[name] = f.at
		i := slices.IndexFunc(out, func(c *resourceapi.DeviceClass) bool { return c.Name == name })
		if i >= 0 {
			out[i] = f.class
			notes = append(notes, fmt.Sprintf("%s: DeviceClass %s: allocated with, over the chart's of that name", f.at, name))
			continue
		}
		out = append(out, f.class)
		notes = append(notes, fmt.Sprintf("%s: DeviceClass %s: allocated with, beside the chart's", f.at, name))
	}
	return out, notes, errors.Join(errs...)
}
