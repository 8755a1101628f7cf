// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"strings"
	"testing"
)

// TestTenantForeignPoolRefused: a compromised node publishes a PF under
// this node's device name in a pool of its own choosing; the scheduler
// allocates a share of it to a pod that lands here. Prepare refuses the
// result, naming the claim, the request, the device and the pool, and
// no VF is reserved or configured; from this node's pool the same claim
// prepares.
func TestTenantForeignPoolRefused(t *testing.T) {
	e := newEnv(t, cx7Node, "")
	c := e.allocate(newClaim("", share("nic", "10G")))
	r := &c.Status.Allocation.Devices.Results[0]
	own := r.Pool
	for _, pool := range []string{"worker-2", "", testNode + "-x"} {
		r.Pool = pool
		_, err := e.prepare(c)
		if err == nil {
			t.Fatalf("a device of pool %q prepared on node %s", pool, testNode)
		}
		for _, want := range []string{"claim ns/" + c.Name, `request "nic"`, "device " + r.Device, `pool "` + pool + `"`, `pool "` + testNode + `"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("pool %q: error %q does not say %s", pool, err, want)
			}
		}
		e.checkPristine()
	}
	r.Pool = own
	e.mustPrepare(c)
	if err := e.unprepare(c); err != nil {
		t.Fatal(err)
	}
	e.checkPristine()
}
