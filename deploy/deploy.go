// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package deploy holds what an operator applies: the Helm chart
// (helm/hwdra) and its rendering as plain manifests (hwdra.yaml: RBAC,
// admission policy, DeviceClasses, the DaemonSet), and gives programs the
// DeviceClasses, so that `hwdra lab` and the tests allocate with exactly
// the classes a cluster has.
package deploy

import (
	_ "embed"
	"fmt"
	"io"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// manifests are the chart rendered with its defaults (hack/render-deploy.sh).
//
//go:embed hwdra.yaml
var manifests string

// DeviceClasses decodes the shipped DeviceClasses.
func DeviceClasses() ([]*resourceapi.DeviceClass, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	var out []*resourceapi.DeviceClass
	for {
		c := &resourceapi.DeviceClass{}
		err := dec.Decode(c)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("deploy/hwdra.yaml: %w", err)
		}
		if c.Kind == "DeviceClass" && c.Name != "" {
			out = append(out, c)
		}
	}
}
