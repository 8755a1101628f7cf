// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package layout holds the tests that keep the house as docs/design.md
// draws it: folders (rooms) whose imports run one way and as its import
// table allows, its package and runtime loop tables true to the tree and
// to internal/agent/loop.go, short functions, and an agent image that
// carries no hardware simulator.
package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/hwdra/hwdra/"

// goList runs go list over the whole module with a format and the given
// build tags, one line per package.
func goList(t *testing.T, tags, format string, pkgs ...string) []string {
	t.Helper()
	args := []string{"list", "-tags", tags, "-f", format}
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, exitStderr(err))
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func exitStderr(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return nil
}

// room is a package's folder as docs/design.md's layout names it: the
// agent's parts, the backends and the tools one folder below their group
// (internal/agent/prepare), other internal packages and the simulator
// (internal/mock) one below internal/, everything else its top-level
// folder.
func room(pkg string) string {
	p := strings.TrimPrefix(pkg, module)
	depth := 1
	switch {
	case strings.HasPrefix(p, "internal/agent/"), strings.HasPrefix(p, "internal/backend/"), strings.HasPrefix(p, "internal/tools/"):
		depth = 3
	case strings.HasPrefix(p, "internal/"):
		depth = 2
	}
	parts := strings.SplitN(p, "/", depth+1)
	return strings.Join(parts[:min(depth, len(parts))], "/")
}

// TestRoomsImportOneWay: no top-level folder imports, through any of its
// packages, a folder that imports it back. A package below prepare (one
// prepare imports) that imports prepare was such an arrow: the NRI plugin
// under metadata/ before it became podnet/.
func TestRoomsImportOneWay(t *testing.T) {
	edges := map[string]map[string][]string{} // room -> room -> "pkg -> pkg"
	for _, line := range goList(t, "", `{{.ImportPath}} {{join .Imports " "}}`, "./...") {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module) || room(f[0]) == room(imp) {
				continue
			}
			if edges[room(f[0])] == nil {
				edges[room(f[0])] = map[string][]string{}
			}
			edges[room(f[0])][room(imp)] = append(edges[room(f[0])][room(imp)], f[0]+" -> "+imp)
		}
	}
	if len(edges) < 10 {
		t.Fatalf("go list found only %d rooms with imports: %v", len(edges), edges)
	}
	// A depth-first search finds every cycle's closing arrow.
	const (
		unseen = iota
		open
		done
	)
	mark := map[string]int{}
	var path []string
	var visit func(r string)
	visit = func(r string) {
		mark[r] = open
		path = append(path, r)
		for _, to := range slices.Sorted(mapsKeys(edges[r])) {
			switch mark[to] {
			case open:
				cycle := append(slices.Clone(path[slices.Index(path, to):]), to)
				t.Errorf("rooms import each other: %s; the arrows back: %v", strings.Join(cycle, " -> "), edges[r][to])
			case unseen:
				visit(to)
			}
		}
		path = path[:len(path)-1]
		mark[r] = done
	}
	for _, r := range slices.Sorted(mapsKeys(edges)) {
		if mark[r] == unseen {
			visit(r)
		}
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// ImageTags are the build tags of the agent's image (hack/build-image.sh).
const ImageTags = "nolab,nomock,grpcnotrace"

// TestImageBuildHasNoSimulator: the agent image's binary links no package
// of the hardware simulator (internal/mock/, go-nvml's mocks) and no test helper, and still has the
// agent and the real backends.
func TestImageBuildHasNoSimulator(t *testing.T) {
	deps := goList(t, ImageTags, "{{.ImportPath}}", "-deps", "./cmd/hwdra")
	var ours []string
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/NVIDIA/go-nvml/pkg/nvml/mock") {
			t.Errorf("the image's build links go-nvml's mock %s", d)
		}
		if strings.HasPrefix(d, module) {
			ours = append(ours, strings.TrimPrefix(d, module))
		}
	}
	for _, want := range []string{"internal/agent", "internal/backend/nvml", "internal/backend/sriov", "internal/backend", "internal/agent/podnet", "internal/agent/prepare/gpu"} {
		if !slices.Contains(ours, want) {
			t.Errorf("the image's build lacks %s: %v", want, ours)
		}
	}
	for _, p := range ours {
		if room(p) == "internal/mock" || room(p) == "internal/tools/lab" || room(p) == "internal/tools/allocate" || strings.HasSuffix(p, "test") {
			t.Errorf("the image's build links %s", p)
		}
	}
	// The full build (go run ./cmd/hwdra, the lab) keeps the simulator.
	full := goList(t, "", "{{.ImportPath}}", "-deps", "./cmd/hwdra")
	if !slices.Contains(full, module+"internal/mock/gpusim") || !slices.Contains(full, module+"internal/mock/nicsim") {
		t.Errorf("the full build lost the simulator")
	}
}
