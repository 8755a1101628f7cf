// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"testing"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	mockprofile "github.com/hwdra/hwdra/internal/mock/profile"
)

// TestEveryNameIsInTheVocabulary: every attribute, capacity and counter
// name ForNode publishes for every built-in mock profile, with its NICs
// shared and exclusive, is one of package device's names: the builders,
// hwdra convert, the metadata and the tests spell them from there.
func TestEveryNameIsInTheVocabulary(t *testing.T) {
	exclusive, err := config.Parse([]byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\nnics:\n- mode: exclusive\n"))
	if err != nil {
		t.Fatal(err)
	}
	names := 0
	for _, name := range mockprofile.Builtins() {
		inv := probe(t, "mock:"+name)
		for _, cfg := range []*config.AgentConfig{config.Default(), exclusive} {
			res, _ := ForNode(testNode, inv, cfg, device.AllFeatures, hw.Health{})
			for driver, r := range res {
				for _, pool := range r.Pools {
					for _, s := range pool.Slices {
						for _, set := range s.SharedCounters {
							for c := range set.Counters {
								names++
								if !device.Counter(c) {
									t.Errorf("%s: %s counter set %s: counter %q is not in package device", name, driver, set.Name, c)
								}
							}
						}
						for _, d := range s.Devices {
							for a := range d.Attributes {
								names++
								if !device.Published(a) {
									t.Errorf("%s: %s device %s: attribute %q is not in package device", name, driver, d.Name, a)
								}
							}
							for c := range d.Capacity {
								names++
								if !device.Published(c) {
									t.Errorf("%s: %s device %s: capacity %q is not in package device", name, driver, d.Name, c)
								}
							}
							for _, cc := range d.ConsumesCounters {
								for c := range cc.Counters {
									if !device.Counter(c) {
										t.Errorf("%s: %s device %s consumes counter %q, not in package device", name, driver, d.Name, c)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	if names < 1000 {
		t.Fatalf("only %d names checked", names)
	}
}
