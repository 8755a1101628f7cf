// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package mocktest opens mock hardware for tests.
package mocktest

import (
	"testing"

	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

// Open builds the mock hardware of spec for t and closes it when t ends
// (closing it earlier is fine). spec is a built-in profile name, a profile
// file, or a profile's YAML (anything with a colon), which is named
// "test". Like mock.Open it honours persist.DirEnv and nicsim.VethEnv.
func Open(t testing.TB, spec string) *mock.Hardware {
	t.Helper()
	p, err := profile.ParseOrLoad("test", spec)
	if err != nil {
		t.Fatal(err)
	}
	h, err := mock.New(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("closing the mock hardware: %v", err)
		}
	})
	return h
}
