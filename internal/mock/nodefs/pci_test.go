// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nodefs

import "testing"

func TestCanonicalAddress(t *testing.T) {
	for in, want := range map[string]string{
		"0000:1b:00.0":     "0000:1b:00.0",
		"00000000:1B:00.0": "0000:1b:00.0",
		"0000:9D:00.7":     "0000:9d:00.7",
		"0000:1b:00":       "",
		"0000:1b:20.0":     "",
		"0000:1b:00.8":     "",
		"0000:1b:00.0x":    "",
		"1b:00.0":          "",
	} {
		got, ok := CanonicalAddress(in)
		if got != want || ok != (want != "") {
			t.Errorf("CanonicalAddress(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
