// Package deploy holds the manifests an operator applies (RBAC, admission
// policy, DeviceClasses, the DaemonSet) and gives programs the DeviceClasses,
// so that `hwdra lab` and the tests allocate with exactly the classes a
// cluster has.
package deploy

import (
	_ "embed"
	"fmt"
	"io"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

//go:embed 30-deviceclasses.yaml
var deviceClasses string

// DeviceClasses decodes the shipped DeviceClasses.
func DeviceClasses() ([]*resourceapi.DeviceClass, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(deviceClasses), 4096)
	var out []*resourceapi.DeviceClass
	for {
		c := &resourceapi.DeviceClass{}
		err := dec.Decode(c)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("deploy/30-deviceclasses.yaml: %w", err)
		}
		if c.Name != "" {
			out = append(out, c)
		}
	}
}
