// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hwdra/hwdra/internal/backend/sriov"
)

// TestDiscoverVFWhoseNetdevLeft: a VF whose netdev moved into a pod's
// network namespace is gone from the host's sysfs net/ entries; discovery
// still reports the VF (no netdev), and the PF keeps its VF count.
func TestDiscoverVFWhoseNetdevLeft(t *testing.T) {
	h, opts := node(t, twoCX7)
	before, err := sriov.Discover(opts)
	if err != nil {
		t.Fatal(err)
	}
	vf := before[0].VFs[1]
	if vf.Netdev == "" {
		t.Fatal("VF 1 has no netdev to begin with")
	}
	remove(t, dev(h, vf.PCIAddress, "net", vf.Netdev))
	if err := os.Remove(filepath.Join(h.Sysfs, "class", "net", vf.Netdev)); err != nil {
		t.Fatal(err)
	}
	after, err := sriov.Discover(opts)
	if err != nil {
		t.Fatal(err)
	}
	got := after[0]
	if len(got.VFs) != len(before[0].VFs) || got.NumVFs != before[0].NumVFs {
		t.Fatalf("PF has %d VFs (numvfs %d), had %d", len(got.VFs), got.NumVFs, len(before[0].VFs))
	}
	want := vf
	want.Netdev = ""
	if got.VFs[1] != want {
		t.Errorf("VF 1: %+v, want %+v", got.VFs[1], want)
	}
}
