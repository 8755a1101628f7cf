package v1alpha1

import (
	"reflect"
	"strings"
	"testing"
)

// TestDefault: what defaulting writes into the file's rules, and what it
// leaves for Validate to name.
func TestDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   NICRule
		want NICRule
	}{{
		name: "nothing given: shared, the built-in policy",
		in:   NICRule{},
		want: NICRule{Mode: ModeShared, Bandwidth: &Bandwidth{Default: "10G", Minimum: "1G", Step: "1G"}},
	}, {
		name: "step only: the minimum is the step, the default rounds up to a share",
		in:   NICRule{Bandwidth: &Bandwidth{Step: "4G"}},
		want: NICRule{Mode: ModeShared, Bandwidth: &Bandwidth{Default: "12G", Minimum: "4G", Step: "4G"}},
	}, {
		name: "minimum above the built-in default",
		in:   NICRule{Bandwidth: &Bandwidth{Minimum: "40G", Step: "10G"}},
		want: NICRule{Mode: ModeShared, Bandwidth: &Bandwidth{Default: "40G", Minimum: "40G", Step: "10G"}},
	}, {
		name: "an invalid step is not copied to the minimum",
		in:   NICRule{Bandwidth: &Bandwidth{Step: "0"}},
		want: NICRule{Mode: ModeShared, Bandwidth: &Bandwidth{Step: "0"}},
	}, {
		name: "exclusive: no policy; valid selector values in canonical form, invalid ones as written",
		in: NICRule{Mode: ModeExclusive, Select: PFSelector{
			PCIAddresses: []string{"B1:00.1", "0000:17:00"}, VendorIDs: []string{"0x15B3"}, DeviceIDs: []string{"101B", "xyz"},
		}},
		want: NICRule{Mode: ModeExclusive, Select: PFSelector{
			PCIAddresses: []string{"0000:b1:00.1", "0000:17:00"}, VendorIDs: []string{"15b3"}, DeviceIDs: []string{"101b", "xyz"},
		}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := &AgentConfig{NICs: []NICRule{tc.in}}
			c.Default()
			if got := c.NICs[0]; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v %+v\nwant %+v %+v", got, got.Bandwidth, tc.want, tc.want.Bandwidth)
			}
		})
	}
}

// TestValidateNamesEveryProblem: one report, every field with its path.
func TestValidateNamesEveryProblem(t *testing.T) {
	c := &AgentConfig{
		NICs: []NICRule{
			{Mode: "dedicated", Bandwidth: &Bandwidth{Default: "1G"}},
			{Bandwidth: &Bandwidth{Step: "0"}, Select: PFSelector{Names: []string{"a/b"}, Drivers: []string{""}}},
		},
		Health: &HealthConfig{XIDs: XIDConfig{Ignore: []uint64{13}, Report: []uint64{13}}, FatalEffect: "Evict"},
	}
	c.Default()
	var got []string
	for _, e := range c.Validate() {
		got = append(got, e.Field)
	}
	want := []string{"nics[0].mode", "nics[0].bandwidth", "nics[1].select.names[0]", "nics[1].select.drivers[0]",
		"nics[1].bandwidth.step", "health.xids.report[0]", "health.fatalEffect"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fields %s\nwant   %s", strings.Join(got, " "), strings.Join(want, " "))
	}
}
