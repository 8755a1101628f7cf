// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package deploy

import "testing"

func TestDeviceClassesDecode(t *testing.T) {
	classes, err := DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"gpu.hwdra.io": true, "mig.gpu.hwdra.io": true, "vgpu.gpu.hwdra.io": true, "vf-share.sriov.hwdra.io": true, "vf.sriov.hwdra.io": true,
		"passthrough.gpu.hwdra.io": true, "share.gpu.hwdra.io": true, "dedicated-share.gpu.hwdra.io": true}
	for _, c := range classes {
		if len(c.Spec.Selectors) == 0 {
			t.Errorf("class %s selects every device", c.Name)
		}
		delete(want, c.Name)
	}
	if len(want) > 0 {
		t.Fatalf("missing classes %v", want)
	}
}
