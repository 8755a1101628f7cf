// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package deploy holds what an operator applies: the Helm chart
// (helm/hwdra) and its rendering as plain manifests (hwdra.yaml: RBAC,
// admission policy, DeviceClasses, the DaemonSet), and gives programs the
// DeviceClasses, so that `hwdra lab` and the tests allocate with exactly
// the classes a cluster has.
package deploy

import (
	"embed"
	"fmt"
	"io"
	"io/fs"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// manifests are the chart rendered with its defaults (hack/render-deploy.sh).
//
//go:embed hwdra.yaml
var manifests string

// chartFiles are the Helm chart's files ("all:": _helpers.tpl too).
//
//go:embed all:helm/hwdra
var chartFiles embed.FS

// Chart is the Helm chart's files (Chart.yaml at its root), for programs
// that render it with values of their own (package deploy/chart).
func Chart() fs.FS {
	sub, err := fs.Sub(chartFiles, "helm/hwdra")
	if err != nil {
		panic(err) // a fixed path of the embedded tree
	}
	return sub
}

// DeviceClasses decodes the shipped DeviceClasses.
func DeviceClasses() ([]*resourceapi.DeviceClass, error) {
	return DecodeDeviceClasses(strings.NewReader(manifests), "deploy/hwdra.yaml")
}

// DecodeDeviceClasses decodes the DeviceClasses of a YAML stream of
// manifests (other kinds skipped); name is the stream's, for errors.
func DecodeDeviceClasses(r io.Reader, name string) ([]*resourceapi.DeviceClass, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []*resourceapi.DeviceClass
	for {
		c := &resourceapi.DeviceClass{}
		err := dec.Decode(c)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if c.Kind == "DeviceClass" && c.Name != "" {
			out = append(out, c)
		}
	}
}
