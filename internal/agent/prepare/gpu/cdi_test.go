// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"path/filepath"
	"testing"
)

// TestDeviceNodeHostPaths: CDI specs name device nodes by the node's path,
// which differs from the agent's where it runs in a container and sees a
// driver root's dev/ elsewhere (/driver-root/dev on the node's
// /run/nvidia/driver/dev).
func TestDeviceNodeHostPaths(t *testing.T) {
	dev := t.TempDir()
	for _, tc := range []struct {
		name, nodeDev, want string
	}{
		{"agent on the host", dev, filepath.Join(dev, "nvidiactl")},
		{"agent in a container", "/run/nvidia/driver/dev", "/run/nvidia/driver/dev/nvidiactl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := nodeResolver{dev: dev, nodeDev: tc.nodeDev}
			n, err := r.charDev("nvidiactl", fixed(nvidiaMajor, nvidiactlMinor))
			if err != nil {
				t.Fatal(err)
			}
			if n.HostPath != tc.want || n.Path != "/dev/nvidiactl" || n.Major != nvidiaMajor || n.Minor != nvidiactlMinor {
				t.Errorf("node %+v, want host path %s, 195:255", n, tc.want)
			}
		})
	}
}
