// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/hw"
)

// The ledger's keys are persisted: an agent reads the entries an older one
// wrote by them. Each kind keeps its format, and its predicate knows its
// keys and no other kind's.
func TestLedgerKeys(t *testing.T) {
	const gpu = "0000:1b:00.0"
	keys := map[string]string{
		giKey(gpu, 9, hw.Placement{Start: 4, Size: 2}): "gi/0000:1b:00.0/9/4",
		mdevKey("a1b2"):       "mdev/a1b2",
		vfKey("0000:1b:00.4"): "vf/0000:1b:00.4",
		migKey(gpu):           "migmode/0000:1b:00.0",
		settingsKey(gpu):      "settings/0000:1b:00.0",
	}
	for got, want := range keys {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
	for name, is := range map[string]func(string) bool{"mdev/": isMdevKey, "vf/": isVFKey, "migmode/": isMIGKey, "settings/": isSettingsKey} {
		for key := range keys {
			if want := strings.HasPrefix(key, name); is(key) != want {
				t.Errorf("%s predicate on %q: %v", name, key, !want)
			}
		}
	}
}
