// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestTenantForeignPoolRefused: a compromised node publishes a device
// under this node's device name in a pool of its own choosing (another
// node's name, or one it made up); the scheduler allocates it to a pod
// that lands here. Device names repeat from node to node (they derive
// from PCI addresses), so a lookup by name alone would prepare this
// node's GPU for it. Prepare refuses the result, naming the claim, the
// request, the device and the pool, before any hardware is touched; the
// same claim from this node's pool prepares.
func TestTenantForeignPoolRefused(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	before := e.hwState()
	c := e.claim(request{name: "mig", cel: `profile == "1g.10gb"`})
	r := &c.Status.Allocation.Devices.Results[0]
	own := r.Pool
	for _, pool := range []string{"worker-2", "", testNode + "-x"} {
		r.Pool = pool
		_, err := e.prepare(c)
		if err == nil {
			t.Fatalf("a device of pool %q prepared on node %s", pool, testNode)
		}
		for _, want := range []string{"claim default/" + c.Name, `request "mig"`, "device " + r.Device, `pool "` + pool + `"`, `pool "` + testNode + `"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("pool %q: error %q does not say %s", pool, err, want)
			}
		}
		e.wantAsBefore(t, before, "after the refusal of pool "+pool)
		if specs, _ := filepath.Glob(filepath.Join(e.dir, "cdi", "*")); len(specs) != 0 {
			t.Errorf("pool %q: CDI specs left: %v", pool, specs)
		}
		if _, ok := e.checkpointRecord(c.UID); ok {
			t.Errorf("pool %q: the claim is in the checkpoint", pool)
		}
	}
	r.Pool = own
	e.mustPrepare(c)
	e.unprepare(c)
	e.wantAsBefore(t, before, "after unprepare")
}
