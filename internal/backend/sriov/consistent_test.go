// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestConsistentDumps: a dump the kernel interrupted is run again, and one
// that keeps being interrupted is an error, never a partial list.
func TestConsistentDumps(t *testing.T) {
	for _, tc := range []struct {
		name        string
		interrupted int
		wantErr     bool
	}{
		{"whole at once", 0, false},
		{"interrupted twice", 2, false},
		{"always interrupted", 100, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			got, err := consistent(func() ([]int, error) {
				calls++
				if calls <= tc.interrupted {
					return []int{1}, netlink.ErrDumpInterrupted // partial
				}
				return []int{1, 2}, nil
			})
			if tc.wantErr {
				if !errors.Is(err, netlink.ErrDumpInterrupted) || got != nil {
					t.Fatalf("got %v, %v; want no list and the interruption", got, err)
				}
				return
			}
			if err != nil || len(got) != 2 || calls != tc.interrupted+1 {
				t.Fatalf("got %v, %v after %d dumps", got, err, calls)
			}
		})
	}
}
