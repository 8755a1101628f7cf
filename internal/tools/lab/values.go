// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/deploy/chart"
)

// chartClasses are the chart's DeviceClasses the lab allocates with:
// with values files (--values), the chart rendered with them in process
// by helm's library (package deploy/chart), said in a note with the
// extended resources they offer; without, its default rendering
// (deploy/hwdra.yaml). Values the chart refuses are its error, and
// nothing else of the run happens.
func chartClasses(valuesFiles []string) ([]*resourceapi.DeviceClass, []string, error) {
	if len(valuesFiles) == 0 {
		classes, err := deploy.DeviceClasses()
		return classes, nil, err
	}
	classes, err := chart.DeviceClasses(valuesFiles)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	for _, c := range classes {
		if n := c.Spec.ExtendedResourceName; n != nil {
			names = append(names, fmt.Sprintf("%s (%s)", *n, c.Name))
		}
	}
	offered := "none"
	if len(names) > 0 {
		offered = strings.Join(names, ", ")
	}
	note := fmt.Sprintf("--values %s: allocating with the chart's DeviceClasses rendered with these values; extended resources: %s",
		strings.Join(valuesFiles, ", "), offered)
	return classes, []string{note}, nil
}
