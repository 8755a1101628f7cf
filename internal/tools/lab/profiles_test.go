// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/mock/profile"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

var updateUserGuide = flag.Bool("update-user-guide", false, "rewrite the user guide's table of the built-in mock profiles")

// userGuide holds the table, between these markers.
var userGuide = filepath.Join("..", "..", "..", "docs", "user-guide.md")

const (
	tableBegin = "<!-- mock profiles: go test ./internal/tools/lab -run TestUserGuideProfiles -update-user-guide -->\n"
	tableEnd   = "<!-- end of mock profiles -->\n"
	// The table of what each example gets on each profile.
	getsBegin = "<!-- examples per profile: go test ./internal/tools/lab -run TestUserGuideProfiles -update-user-guide -->\n"
	getsEnd   = "<!-- end of examples per profile -->\n"
)

// TestUserGuideProfiles: the user guide's tables of the built-in mock
// profiles say what each has and offers, which example claims fit it and
// what each example gets on it, as the profiles, the slices and the
// allocator have it.
func TestUserGuideProfiles(t *testing.T) {
	profiles, gets := profilesTables(t)
	data, err := os.ReadFile(userGuide)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	for _, table := range []struct{ begin, end, text string }{{tableBegin, tableEnd, profiles}, {getsBegin, getsEnd, gets}} {
		begin, end := strings.Index(doc, table.begin), strings.Index(doc, table.end)
		if begin < 0 || end < begin {
			t.Fatalf("%s has no %q ... %q", userGuide, table.begin, table.end)
		}
		begin += len(table.begin)
		if *updateUserGuide {
			doc = doc[:begin] + table.text + doc[end:]
			continue
		}
		if doc[begin:end] != table.text {
			t.Errorf("%s's table after %q is not what the profiles offer; go test ./internal/tools/lab -run TestUserGuideProfiles -update-user-guide writes:\n%s", userGuide, table.begin, table.text)
		}
	}
	if *updateUserGuide {
		if err := os.WriteFile(userGuide, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// profilesTables are the table of the profiles and the table of what each
// example gets on each profile alone.
func profilesTables(t *testing.T) (string, string) {
	t.Helper()
	ctx := context.Background()
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	files, _, _, err := readClaims([]string{filepath.Join("..", "..", "..", "deploy", "examples")}, nil, classes)
	if err != nil {
		t.Fatal(err)
	}
	var b, gets strings.Builder
	b.WriteString("| profile | GPUs | GPU devices | NICs | NIC devices | examples that fit |\n|---|---|---|---|---|---|\n")
	cells := make([][]string, len(files)) // [file][profile]
	for _, name := range profile.Builtins() {
		p, err := profile.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		objs := publishedSlices(t, "mock:"+name)
		var fit []string
		for i, f := range files {
			claims := make([]*resourceapi.ResourceClaim, len(f.claims))
			for i, c := range f.claims {
				claims[i] = c.DeepCopy()
			}
			if allocateBounded(ctx, allocate.New(allocate.ClusterFeatures, NodeName, objs, classes), claims) == nil {
				fit = append(fit, "`"+strings.TrimSuffix(filepath.Base(f.name), ".yaml")+"`")
				cells[i] = append(cells[i], allocated(objs, claims))
			} else {
				cells[i] = append(cells[i], "refused")
			}
		}
		examples := strings.Join(fit, ", ")
		switch {
		case len(fit) == len(files):
			examples = "all"
		case len(fit) == 0:
			examples = "none"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", name, gpusOf(p), gpuDevices(objs), nicsOf(p), nicDevices(objs), examples)
	}
	gets.WriteString("| example |")
	for _, name := range profile.Builtins() {
		gets.WriteString(" `" + name + "` |")
	}
	gets.WriteString("\n|---|" + strings.Repeat("---|", len(profile.Builtins())) + "\n")
	for i, f := range files {
		fmt.Fprintf(&gets, "| `%s` | %s |\n", filepath.Base(f.name), strings.Join(cells[i], " | "))
	}
	return b.String(), gets.String()
}

// allocated says what the claims got, device by device: the kind (and
// profile) of each, with the subrequest a prioritized list chose.
func allocated(objs []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim) string {
	devs := map[string]resourceapi.Device{}
	for _, s := range objs {
		for _, d := range s.Spec.Devices {
			devs[s.Spec.Driver+"/"+d.Name] = d
		}
	}
	var got []string
	count := map[string]int{}
	for _, c := range claims {
		for _, r := range c.Status.Allocation.Devices.Results {
			what := describe(r.Driver, devs[r.Driver+"/"+r.Device])
			if _, sub, ok := strings.Cut(r.Request, "/"); ok {
				what += " (`" + sub + "`)"
			}
			if count[what]++; count[what] == 1 {
				got = append(got, what)
			}
		}
	}
	for i, what := range got {
		if n := count[what]; n > 1 {
			got[i] = fmt.Sprintf("%d × %s", n, what)
		}
	}
	return strings.Join(got, " + ")
}

// describe names a published device's kind as the user asked for it.
func describe(driver string, d resourceapi.Device) string {
	str := func(name resourceapi.QualifiedName) string {
		if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return ""
	}
	if driver == device.NICDriver {
		if str(device.NICAttrMode) == "shared" {
			return "VF share"
		}
		return "VF"
	}
	switch str(device.AttrType) {
	case device.KindGPU:
		return "whole GPU"
	case device.KindMIG:
		return "MIG " + str(device.AttrProfile)
	case device.KindVGPU:
		return "vGPU " + str(device.AttrProfile)
	case device.KindShare:
		return "GPU share"
	case device.KindPassthrough:
		return "passthrough GPU"
	}
	return d.Name
}

func gpusOf(p profile.Profile) string {
	var groups []string
	for _, g := range p.GPUs {
		s := fmt.Sprintf("%d × %s", g.Count, g.Model)
		switch {
		case g.Virtualization == profile.VirtualizationHostVGPU && g.VGPUFramework == profile.VGPUFrameworkVFIO:
			s += ", vGPU host (VFIO framework)"
		case g.Virtualization == profile.VirtualizationHostVGPU:
			s += ", vGPU host"
		case g.Virtualization == profile.VirtualizationPassthrough:
			s += ", bound to vfio-pci"
		case g.MIG && len(g.MIGInstances) > 0:
			var in []string
			for _, mi := range g.MIGInstances {
				in = append(in, fmt.Sprintf("%s at slice %d", mi.Profile, mi.Start))
			}
			s += ", MIG on with " + strings.Join(in, " and ") + " on each"
		case g.MIG:
			s += ", MIG on"
		default:
			s += ", MIG off"
		}
		groups = append(groups, s)
	}
	return orNone(groups)
}

func gpuDevices(objs []*resourceapi.ResourceSlice) string {
	count := map[string]int{}
	for _, s := range objs {
		if s.Spec.Driver != device.GPUDriver {
			continue
		}
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[device.AttrType]; ok && a.StringValue != nil {
				count[*a.StringValue]++
			}
		}
	}
	var kinds []string
	for _, k := range []struct{ kind, what string }{{device.KindGPU, "whole GPUs"}, {device.KindMIG, "MIG partitions"}, {device.KindVGPU, "vGPUs"}, {device.KindPassthrough, "passthrough GPUs"}, {device.KindShare, "shareable GPUs"}} {
		if n := count[k.kind]; n == 1 {
			kinds = append(kinds, "1 "+strings.TrimSuffix(k.what, "s"))
		} else if n > 1 {
			kinds = append(kinds, fmt.Sprintf("%d %s", n, k.what))
		}
	}
	if len(kinds) == 0 {
		return "none"
	}
	return strings.Join(kinds, ", ")
}

func nicsOf(p profile.Profile) string {
	var groups []string
	for _, g := range p.NICs {
		m, _ := model.LookupNIC(g.Model)
		speed, link := m.SpeedMbps, m.LinkTypes[0]
		if g.SpeedMbps > 0 {
			speed = g.SpeedMbps
		}
		if g.LinkType != "" {
			link = g.LinkType
		}
		s := fmt.Sprintf("%d × %s (%dG %s), %d VFs each", g.Count, g.Model, speed/1000, map[hw.LinkType]string{hw.LinkEthernet: "Ethernet", hw.LinkInfiniBand: "InfiniBand"}[link], g.VFs)
		if g.DefaultRoute != nil {
			s += ", one on the default route"
		}
		groups = append(groups, s)
	}
	return orNone(groups)
}

func nicDevices(objs []*resourceapi.ResourceSlice) string {
	n := 0
	for _, s := range objs {
		if s.Spec.Driver == device.NICDriver {
			n += len(s.Spec.Devices)
		}
	}
	if n == 0 {
		return "none"
	}
	return fmt.Sprintf("%d shared PFs", n)
}

func orNone(parts []string) string {
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// publishedSlices are the slices the agent publishes on the hardware, with
// the default configuration.
func publishedSlices(t *testing.T, hardware string) []*resourceapi.ResourceSlice {
	t.Helper()
	inv, err := backend.Probe(context.Background(), hardware)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := resources.ForNode(NodeName, inv, config.Default(), device.AllFeatures, hw.Health{})
	var objs []*resourceapi.ResourceSlice
	for driver := range res {
		for _, s := range resources.Objects(driver, NodeName, res[driver]) {
			objs = append(objs, &s)
		}
	}
	return objs
}
